#!/usr/bin/env node
// Recomputes the OSS signatures printed by oss_sign_vectors with the official ali-oss SDK
// (signUtils) and compares them. Usage: node oss_sign_sdk.js PATH/TO/oss_sign_vectors
// Needs tests/ufs/oss_sdk/node_modules (npm ci there; scripts/test.sh does it).
'use strict';
const { execFileSync } = require('child_process');
const path = require('path');
const signUtils = require(path.join(__dirname, 'oss_sdk/node_modules/ali-oss/lib/common/signUtils.js'));

const out = execFileSync(process.argv[2], { encoding: 'utf8', maxBuffer: 64 << 20 });
let n = 0;
for (const line of out.split('\n')) {
  if (!line) continue;
  const v = JSON.parse(line);
  const pairs = list => Object.fromEntries(list.map(([k, val]) => [k, val]));
  // V4: the request's headers plus the ones Granary added (x-oss-date, ...), minus authorization.
  const v4added = pairs(v.v4.filter(([k]) => k !== 'authorization'));
  const headers4 = Object.assign({}, pairs(v.headers.map(([k, val]) => [k.toLowerCase(), val])), v4added);
  const want4 = signUtils.authorizationV4(v.access_key, v.secret_key, v.region, v.method,
    { headers: headers4, queries: pairs(v.query) }, v.bucket, v.key, v.additional.map(([k]) => k));
  const got4 = pairs(v.v4).authorization;
  // The V4 timestamp must be the ISO basic form of the request time.
  const iso = new Date(v.time * 1000).toISOString().replace(/[-:]/g, '').replace(/\.\d{3}/, '');
  if (want4 !== got4 || v4added['x-oss-date'] !== iso) {
    console.log('V4 MISMATCH', line, '\nsdk:     ', want4, '\ngranary: ', got4);
    process.exit(1);
  }
  // V1
  const v1added = pairs(v.v1.filter(([k]) => k !== 'authorization'));
  const headers1 = Object.assign({}, pairs(v.headers.map(([k, val]) => [k.toLowerCase(), val])), v1added);
  const resource = '/' + v.bucket + '/' + v.key;
  const canonical = signUtils.buildCanonicalString(v.method, resource,
    { headers: headers1, parameters: pairs(v.subresources) });
  const want1 = signUtils.authorization(v.access_key, v.secret_key, canonical);
  const got1 = pairs(v.v1).authorization;
  if (want1 !== got1 || v1added['x-oss-date'] !== new Date(v.time * 1000).toUTCString()) {
    console.log('V1 MISMATCH', line, '\nsdk:     ', want1, '\ngranary: ', got1);
    process.exit(1);
  }
  n++;
}
if (n === 0) { console.log('no vectors'); process.exit(1); }
console.log(`${n} requests: V4 and V1 signatures match the ali-oss SDK`);
