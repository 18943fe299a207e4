#!/usr/bin/python3
"""Deployment checks (issue 9): the Kubernetes manifests render (kubectl kustomize) and pass
yamllint, and the properties that matter hold in what renders; the worker's volumes are the ones
generated from the tier config; the Fluid config parser reads Fluid-shaped config.json files; the
image's runtime packages cover what the binaries load; the entrypoint script's roles exec the
command lines they should (fake binaries), and it runs the real binaries on this machine the way the
pods run them (a real FUSE mount; the FUSE pod's hand-over, keeper and crash story).

Run by ctest with GRANARY_BIN_DIR (the built binaries) and GRANARY_SOURCE_DIR.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import yaml

from testlib import mounted, read, run, wait_for

SRC = os.environ.get("GRANARY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("GRANARY_BIN_DIR", os.path.join(SRC, "build", "bin"))
DEPLOY = os.path.join(SRC, "deploy")
K8S = os.path.join(DEPLOY, "kubernetes")
ENTRYPOINT = os.path.join(DEPLOY, "docker", "granary-entrypoint")


def render(overlay):
    r = run(["kubectl", "kustomize", os.path.join(K8S, overlay)])
    assert r.returncode == 0, r.stderr
    # kustomize's deprecation warnings (bases, patchesStrategicMerge, commonLabels) are defects
    # too: the next kustomize drops what they warn of (issue 54).
    assert "Warning" not in r.stderr, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def quantity(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+)([KMGT]i)?", str(q))
    assert m, q
    return int(m.group(1)) * units.get(m.group(2), 1)


def find(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind} {name} in the rendered manifests")


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = render("overlays/gpu")
        with open(os.path.join(K8S, "base", "granary.yaml")) as f:
            cls.config_text = f.read()
        cls.config = yaml.safe_load(cls.config_text)

    def test_yamllint(self):
        r = run(["yamllint", "-s", "-c", os.path.join(DEPLOY, ".yamllint"), DEPLOY])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_every_overlay_renders(self):
        for overlay in ("base", "overlays/gpu", "overlays/prometheus-operator", "overlays/ha"):
            kinds = [d["kind"] for d in render(overlay)]
            self.assertIn("DaemonSet", kinds, overlay)
        self.assertIn("PodMonitor", [d["kind"] for d in render("overlays/prometheus-operator")])

    def test_the_config_map_is_the_config_and_the_config_parses(self):
        cm = next(d for d in self.docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("granary-config"))
        self.assertEqual(cm["data"]["granary.yaml"], self.config_text)
        r = run([os.path.join(BIN, "granary"), "--config", os.path.join(K8S, "base", "granary.yaml"), "config",
                 "--get", "fuse.mountpoint"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), self.config["fuse"]["mountpoint"])

    def test_master_statefulset(self):
        sts = find(self.docs, "StatefulSet", "granary-master")
        svc = find(self.docs, "Service", "granary-master")
        self.assertEqual(svc["spec"]["clusterIP"], "None")
        self.assertEqual(sts["spec"]["serviceName"], "granary-master")
        self.assertTrue(self.config["master"]["address"].startswith("granary-master-0.granary-master:"))
        claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
        c = sts["spec"]["template"]["spec"]["containers"][0]
        data = [m for m in c["volumeMounts"] if m["name"] == claim]
        self.assertEqual(data[0]["mountPath"], self.config["master"]["data_dir"])
        self.assertTrue(sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"])
        self.check_probes(c, self.config["master"]["metrics_listen"])

    def test_standby_masters_overlay(self):
        """overlays/ha: three masters electing through a 3-member etcd; workers and FUSE list all three."""
        docs = render("overlays/ha")
        sts = find(docs, "StatefulSet", "granary-master")
        self.assertEqual(sts["spec"]["replicas"], 3)
        c = sts["spec"]["template"]["spec"]["containers"][0]
        args = c["args"]
        endpoints = args[args.index("--master.etcd_endpoints") + 1].split(",")
        etcd = find(docs, "StatefulSet", "granary-etcd")
        etcd_svc = find(docs, "Service", "granary-etcd")
        self.assertEqual(etcd["spec"]["replicas"], 3)
        self.assertEqual(etcd["spec"]["serviceName"], etcd_svc["metadata"]["name"])
        self.assertEqual(endpoints, [f"https://granary-etcd-{i}.granary-etcd:2379" for i in range(3)])
        tls = {k: args[args.index(f"--master.etcd_tls_{k}") + 1] for k in ("ca", "cert", "key")}
        # The masters' client certificate: the Secret granary-etcd-client, read-only, its three keys named.
        spec = sts["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "granary-etcd-client")
        mount = next(m for m in c["volumeMounts"] if m["name"] == volume["name"])
        self.assertTrue(mount.get("readOnly"), mount)
        self.assertEqual(tls, {k: os.path.join(mount["mountPath"], f)
                               for k, f in (("ca", "ca.crt"), ("cert", "tls.crt"), ("key", "tls.key"))})
        self.assertEqual(args[args.index("--master.advertise") + 1], "$(POD_NAME).granary-master:19998")
        self.assertIn("POD_NAME", [e["name"] for e in c["env"]])
        masters = ",".join(f"granary-master-{i}.granary-master:19998" for i in range(3))
        for name, container in (("granary-worker", "worker"), ("granary-fuse", "fuse")):
            ds = find(docs, "DaemonSet", name)
            cs = {x["name"]: x for x in ds["spec"]["template"]["spec"]["containers"]}
            a = cs[container]["args"]
            self.assertEqual(a[a.index("--master.address") + 1], masters, name)
        # The flags are settings the daemons accept, with these values (the same parser reads a file).
        values = {"etcd_endpoints": ",".join(endpoints), "address": masters,
                  "advertise": "granary-master-1.granary-master:19998",
                  "etcd_tls_ca": tls["ca"], "etcd_tls_cert": tls["cert"], "etcd_tls_key": tls["key"]}
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump({"master": values}, f)
            f.flush()
            for key, value in values.items():
                r = run([os.path.join(BIN, "granary"), "--config", f.name, "config", "--get", "master." + key])
                self.assertEqual(r.returncode, 0, key + ": " + r.stdout + r.stderr)
                self.assertEqual(r.stdout.strip(), value)
        self.assertEqual(find(docs, "PodDisruptionBudget", "granary-master")["spec"]["maxUnavailable"], 1)
        # A master knowing no leader is not ready (/readyz) yet answers reads: its name must resolve.
        svc = find(docs, "Service", "granary-master")
        self.assertTrue(svc["spec"].get("publishNotReadyAddresses"), svc)
        self.assertEqual(svc["spec"]["clusterIP"], "None")

    def test_standby_masters_etcd_is_tls_with_client_certificates(self):
        """overlays/ha: etcd serves clients and peers over https only to holders of a certificate from
        its CA (the Secret granary-etcd-tls), and a NetworkPolicy lets only the masters reach it."""
        docs = render("overlays/ha")
        etcd = find(docs, "StatefulSet", "granary-etcd")
        spec = etcd["spec"]["template"]["spec"]
        c = spec["containers"][0]
        flags = {}
        for a in c["command"][1:]:
            k, _, v = a.partition("=")
            flags[k] = v
        for f in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
                  "--initial-advertise-peer-urls"):
            self.assertTrue(flags[f].startswith("https://"), f"{f}={flags[f]}")
        for member in flags["--initial-cluster"].split(","):
            self.assertTrue(member.split("=", 1)[1].startswith("https://"), member)
        self.assertIn("--client-cert-auth", flags)
        self.assertIn("--peer-client-cert-auth", flags)
        self.assertEqual(flags.get("--client-cert-auth"), "")  # a bare switch: not =false
        self.assertEqual(flags.get("--peer-client-cert-auth"), "")
        volume = next(v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "granary-etcd-tls")
        mount = next(m for m in c["volumeMounts"] if m["name"] == volume["name"])
        self.assertTrue(mount.get("readOnly"), mount)
        files = {"--trusted-ca-file": "ca.crt", "--cert-file": "server.crt", "--key-file": "server.key",
                 "--peer-trusted-ca-file": "ca.crt", "--peer-cert-file": "peer.crt", "--peer-key-file": "peer.key"}
        for f, name in files.items():
            self.assertEqual(flags.get(f), os.path.join(mount["mountPath"], name), f)
        # The probe cannot show a client certificate: it reads the plain-HTTP metrics listener, not 2379.
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        probe_port = c["readinessProbe"]["httpGet"]["port"]
        probe_port = ports.get(probe_port, probe_port)
        self.assertNotIn(probe_port, (2379, 2380))
        self.assertTrue(flags["--listen-metrics-urls"].endswith(f":{probe_port}"), flags["--listen-metrics-urls"])

        def selects(selector, labels):
            return bool(selector) and all(labels.get(k) == v for k, v in selector["matchLabels"].items())

        def pod_labels(kind, name):
            return find(docs, kind, name)["spec"]["template"]["metadata"]["labels"]

        etcd_labels = pod_labels("StatefulSet", "granary-etcd")
        master_labels = pod_labels("StatefulSet", "granary-master")
        others = [pod_labels("DaemonSet", "granary-worker"), pod_labels("DaemonSet", "granary-fuse")]
        policies = [d for d in docs if d["kind"] == "NetworkPolicy" and selects(d["spec"]["podSelector"], etcd_labels)]
        self.assertEqual(len(policies), 1, "one NetworkPolicy selects the etcd pods")
        policy = policies[0]
        # One namespace for the three (a podSelector picks pods of the policy's own namespace only).
        master_namespace = find(docs, "StatefulSet", "granary-master")["metadata"].get("namespace")
        self.assertEqual(policy["metadata"].get("namespace"), etcd["metadata"].get("namespace"))
        self.assertEqual(policy["metadata"].get("namespace"), master_namespace)
        self.assertIn("Ingress", policy["spec"]["policyTypes"])
        allowed = {}  # port -> the selectors of the pods let in
        for rule in policy["spec"]["ingress"]:
            self.assertTrue(rule.get("from") and rule.get("ports"), f"rule {rule} opens a port to everyone")
            for peer in rule["from"]:
                self.assertEqual(set(peer), {"podSelector"}, f"{peer}: only pods of this namespace")
                for p in rule["ports"]:
                    allowed.setdefault(p["port"], []).append(peer["podSelector"])
        self.assertEqual(set(allowed), {2379, 2380})
        self.assertTrue(all(selects(s, master_labels) for s in allowed[2379]), allowed[2379])
        self.assertFalse(any(selects(s, etcd_labels) or selects(s, o) for s in allowed[2379] for o in others))
        self.assertTrue(all(selects(s, etcd_labels) for s in allowed[2380]), allowed[2380])
        self.assertFalse(any(selects(s, master_labels) or selects(s, o) for s in allowed[2380] for o in others))

    def check_probes(self, container, metrics_listen):
        port = int(metrics_listen.rsplit(":", 1)[1])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        self.assertEqual(ports["metrics"], port)
        self.assertEqual(container["readinessProbe"]["httpGet"]["path"], "/readyz")
        self.assertEqual(container["livenessProbe"]["httpGet"]["path"], "/healthz")
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertIn(container[probe]["httpGet"]["port"], ("metrics", port))

    def test_worker_volumes_and_memory_follow_the_tiers(self):
        ds = find(self.docs, "DaemonSet", "granary-worker")
        spec = ds["spec"]["template"]["spec"]
        self.assertTrue(spec["hostNetwork"])
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        self.assertEqual(terms[0]["matchExpressions"][0]["key"], "nvidia.com/gpu.present")
        c = spec["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        mem = 0
        levels = self.config["worker"]["tieredstore"]["levels"]
        for level in levels:
            path, quota = level["path"], quantity(level["quota"])
            names = [n for n, p in mounts.items() if p == path]
            self.assertEqual(len(names), 1, f"tier {path} is mounted once")
            v = volumes[names[0]]
            if level["mediumtype"] == "MEM":
                self.assertEqual(v["emptyDir"]["medium"], "Memory")
                self.assertEqual(quantity(v["emptyDir"]["sizeLimit"]), quota)
                mem += quota
            else:
                self.assertEqual(v["hostPath"]["path"], path)
        self.assertEqual(quantity(c["resources"]["limits"]["memory"]), 2 * 2**30 + mem,
                         "the MEM tiers are charged to the pod's memory")
        self.assertEqual(quantity(c["resources"]["requests"]["memory"]), 1 * 2**30 + mem)
        self.check_probes(c, self.config["worker"]["metrics_listen"])
        self.assertEqual(volumes["run"]["hostPath"]["path"], os.path.dirname(self.config["worker"]["local_socket"]))
        self.assertEqual(c["securityContext"].get("runAsUser"), 0,
                         "root without capabilities: its hostPath directories are root-owned (the image's user is not)")

    def test_the_checked_in_tier_patch_is_what_the_generator_makes(self):
        r = run([os.path.join(BIN, "granary"), "deploy", "worker-tiers", "--config",
                 "deploy/kubernetes/base/granary.yaml"], cwd=SRC)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(K8S, "overlays", "gpu", "worker-tiers.yaml")) as f:
            self.assertEqual(f.read(), r.stdout, "run scripts/render-deploy.sh after changing the tiers")

    def setting(self, container, key):
        """The value of a setting for a container: its --KEY VALUE argument, else granary.yaml."""
        args = container.get("command", []) + container.get("args", [])
        if "--" + key in args:
            return args[args.index("--" + key) + 1]
        node = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def test_fuse_daemonset(self):
        ds = find(self.docs, "DaemonSet", "granary-fuse")
        spec = ds["spec"]["template"]["spec"]
        c = spec["containers"][0]
        self.assertTrue(c["securityContext"]["privileged"])
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        dev = next(n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/dev/fuse")
        self.assertEqual(volumes[dev]["hostPath"]["type"], "CharDevice")
        self.assertEqual(mounts[dev]["mountPath"], "/dev/fuse")
        bidi = [m for m in c["volumeMounts"] if m.get("mountPropagation") == "Bidirectional"]
        self.assertEqual(len(bidi), 1)
        host_dir = volumes[bidi[0]["name"]]["hostPath"]["path"]
        mountpoint = self.config["fuse"]["mountpoint"]
        self.assertEqual(bidi[0]["mountPath"], host_dir, "same path inside and on the host")
        self.assertEqual(os.path.dirname(mountpoint), host_dir, "the mount point is inside the propagated directory")
        self.check_probes(c, self.config["fuse"]["metrics_listen"])
        self.assertEqual(volumes["run"]["hostPath"]["path"], os.path.dirname(self.config["worker"]["local_socket"]),
                         "the FUSE pod sees the worker's local socket")
        self.__class__.fuse_host_dir = host_dir

    def test_fuse_updates_hand_the_mount_over(self):
        """A new FUSE pod starts beside the old one and takes the live connection over through the
        hand-over socket in the hostPath /run/granary; the old one idles until deleted, and nothing
        unmounts on the way (docs/deploy.md, "Upgrades")."""
        ds = find(self.docs, "DaemonSet", "granary-fuse")
        self.assertEqual(ds["spec"]["updateStrategy"]["type"], "RollingUpdate")
        self.assertEqual(ds["spec"]["updateStrategy"]["rollingUpdate"], {"maxSurge": 1, "maxUnavailable": 0})
        spec = ds["spec"]["template"]["spec"]
        c = next(c for c in spec["containers"] if c["name"] == "fuse")
        volumes = {v["name"]: v for v in spec["volumes"]}
        run_dir = next(m["mountPath"] for m in c["volumeMounts"]
                       if volumes[m["name"]].get("hostPath", {}).get("path") == "/run/granary")
        self.assertEqual(run_dir, "/run/granary")
        handover = self.setting(c, "fuse.handover_socket")
        if handover:  # else derived: /run/granary/fuse-<hash>.sock for root
            self.assertEqual(os.path.dirname(handover), run_dir, "the hand-over socket is in the shared hostPath")
        self.assertEqual(c["securityContext"].get("runAsUser"), 0,
                         "root: the image's user could not make the hand-over socket in the root-owned /run/granary")
        self.assertIn(self.setting(c, "fuse.exit_after_handover"), (False, "false"),
                      "a handed-over granary-fuse idles until SIGTERM (an exit would be restarted by the kubelet)")
        # Two granary-fuse on a node at once, each with its metrics port: not on the host network.
        self.assertFalse(spec.get("hostNetwork", False), "the surge pod would contend for the old one's port")
        self.assertFalse([p for p in c["ports"] if "hostPort" in p])
        env = {e["name"]: e for e in c.get("env", [])}
        self.assertEqual(env["GRANARY_WORKER_HOST"]["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP",
                         "off the host network, granary-fuse dials the node's worker at the node's IP")
        # No preStop unmounts: it would pull the mount from under running pods at every update.
        for cont in spec["containers"] + spec.get("initContainers", []):
            pre = json.dumps(cont.get("lifecycle", {}).get("preStop", {}))
            self.assertNotIn("fuse-stop", pre, cont["name"])
            self.assertNotIn("umount", pre, cont["name"])
        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/readyz")
        self.assertIn("startupProbe", c)
        live = c["livenessProbe"]
        self.assertGreaterEqual(live.get("periodSeconds", 10) * live.get("failureThreshold", 3), 60,
                                "a liveness kill is a SIGTERM, on which a serving granary-fuse unmounts")
        self.assertGreaterEqual(spec.get("terminationGracePeriodSeconds", 30), 30)

    def test_fuse_keeper_sidecar(self):
        """The keeper is a native sidecar holding the /dev/fuse descriptor across a crash of the fuse
        container, listening where fuse.keeper points, in an emptyDir the two containers share."""
        spec = find(self.docs, "DaemonSet", "granary-fuse")["spec"]["template"]["spec"]
        keepers = [k for k in spec.get("initContainers", []) if k["name"] == "fuse-keeper"]
        self.assertEqual(len(keepers), 1)
        k = keepers[0]
        c = next(c for c in spec["containers"] if c["name"] == "fuse")
        self.assertEqual(k.get("restartPolicy"), "Always", "a native sidecar (Kubernetes >= 1.29)")
        self.assertEqual(k["image"], c["image"])
        self.assertEqual(k["command"][-1], "fuse-keeper")
        self.assertTrue(k["command"][0].endswith("granary-entrypoint"))
        # Unprivileged, no /dev/fuse, small.
        self.assertFalse(k.get("securityContext", {}).get("privileged", False))
        self.assertTrue(k["securityContext"]["runAsNonRoot"])
        self.assertFalse(k["securityContext"]["allowPrivilegeEscalation"])
        self.assertFalse([m for m in k["volumeMounts"] if m["mountPath"] == "/dev/fuse"])
        self.assertLessEqual(quantity(k["resources"]["limits"]["memory"]), 256 * 2**20)
        # The socket: GRANARY_KEEPER_SOCKET, else the entrypoint's default; = the fuse container's fuse.keeper.
        env = {e["name"]: e.get("value") for e in k.get("env", [])}
        default = re.search(r"GRANARY_KEEPER_SOCKET:-([^}]+)\}", read(ENTRYPOINT)).group(1)
        sock = env.get("GRANARY_KEEPER_SOCKET", default)
        self.assertEqual(self.setting(c, "fuse.keeper"), sock, "granary-fuse deposits where the keeper listens")
        volumes = {v["name"]: v for v in spec["volumes"]}
        shared = [m for m in k["volumeMounts"] if m["mountPath"] == os.path.dirname(sock)]
        self.assertEqual(len(shared), 1, "the socket's directory is a volume")
        self.assertIn("emptyDir", volumes[shared[0]["name"]],
                      "the pod's own: it outlives a crash of the fuse container")
        self.assertIn({"name": shared[0]["name"], "mountPath": os.path.dirname(sock)},
                      [{"name": m["name"], "mountPath": m["mountPath"]} for m in c["volumeMounts"]],
                      "the fuse container sees the keeper's socket at the same path")
        for probe in ("startupProbe", "readinessProbe"):
            self.assertEqual(k[probe]["exec"]["command"], ["test", "-S", sock], probe)

    def test_training_job_sees_the_mount_through_host_to_container(self):
        with open(os.path.join(K8S, "examples", "training-job.yaml")) as f:
            job = yaml.safe_load(f)
        spec = job["spec"]["template"]["spec"]
        m = spec["containers"][0]["volumeMounts"][0]
        self.assertEqual(m["mountPath"], "/data")
        self.assertEqual(m["mountPropagation"], "HostToContainer")
        v = next(v for v in spec["volumes"] if v["name"] == m["name"])
        self.assertEqual(v["hostPath"]["path"], os.path.dirname(self.config["fuse"]["mountpoint"]),
                         "the pod mounts the directory the FUSE pod mounts into, not the mount point")

    def test_no_secret_value_inline(self):
        docs = list(self.docs)
        for root, _, files in os.walk(DEPLOY):
            for name in files:
                if name.endswith((".yaml", ".yml")):
                    with open(os.path.join(root, name)) as f:
                        docs += [d for d in yaml.safe_load_all(f) if d]
        secret_words = re.compile(r"(secret|password|token|access[_-]?key|credential)", re.I)
        for d in docs:
            self.assertFalse(d.get("kind") == "Secret" and (d.get("data") or d.get("stringData")),
                             f"Secret {d.get('metadata', {}).get('name')} carries values")

            def walk(node, path):
                if isinstance(node, dict):
                    if "name" in node and "value" in node and secret_words.search(str(node["name"])):
                        self.fail(f"{path}: env {node['name']} has an inline value")
                    for k, v in node.items():
                        walk(v, path + "." + str(k))
                elif isinstance(node, list):
                    for i, v in enumerate(node):
                        walk(v, f"{path}[{i}]")
            walk(d, d.get("kind", "?"))
        for kind in ("StatefulSet", "DaemonSet"):
            for d in self.docs:
                if d["kind"] == kind:
                    secrets = [v for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v]
                    self.assertTrue(secrets, f"{d['metadata']['name']} mounts its secrets as files")

    def test_pods_are_scraped(self):
        for d in self.docs:
            if d["kind"] in ("StatefulSet", "DaemonSet"):
                a = d["spec"]["template"]["metadata"]["annotations"]
                self.assertEqual(a["prometheus.io/scrape"], "true")
                self.assertEqual(a["prometheus.io/path"], "/metrics")


class DashboardTest(unittest.TestCase):
    def test_writes_are_on_the_dashboard(self):
        with open(os.path.join(DEPLOY, "grafana", "granary-dashboard.json")) as f:
            d = json.load(f)
        exprs = " ".join(t["expr"] for p in d["panels"] for t in p["targets"])
        for name in ("granary_worker_uploaded_bytes_total", "granary_worker_writeback_backlog_files",
                     "granary_worker_upload_failures_total", "granary_worker_write_sessions"):
            self.assertIn(name, exprs)
        ids = [p["id"] for p in d["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are unique")
        cells = set()
        for p in d["panels"]:
            g = p["gridPos"]
            for y in range(g["y"], g["y"] + g["h"]):
                for x in range(g["x"], g["x"] + g["w"]):
                    self.assertNotIn((x, y), cells, f"panel {p['id']} overlaps another")
                    cells.add((x, y))


class FluidTest(unittest.TestCase):
    def plan(self, config, secrets="/etc/fluid/secrets"):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write(config if isinstance(config, str) else json.dumps(config))
            f.flush()
            r = run([os.path.join(BIN, "granary"), "fluid-fuse", "--dry-run", "--fluid-config", f.name,
                     "--secrets-dir", secrets], env={**os.environ, "GRANARY_MASTER": ""})
        return r

    def test_examples_parse(self):
        r = self.plan(read(os.path.join(DEPLOY, "fluid", "examples", "config-s3.json")))
        self.assertEqual(r.returncode, 0, r.stderr)
        p = json.loads(r.stdout)
        self.assertEqual(p["target_path"], "/runtime-mnt/thin/default/imagenet/thin-fuse")
        self.assertEqual(p["root"], "/imagenet", "a single dataset is the mount's root")
        m = p["mounts"][0]
        self.assertEqual((m["path"], m["uri"]), ("/imagenet", "s3://datasets/imagenet"))
        self.assertEqual(m["options"]["access_key_file"], "/etc/fluid/secrets/imagenet-s3/access-key")
        self.assertEqual(m["options"]["secret_key_file"], "/etc/fluid/secrets/imagenet-s3/secret-key")
        self.assertEqual(m["options"]["endpoint"], "http://rgw.storage.svc:7480")
        self.assertIn("--fuse.mountpoint", p["fuse_args"])

        r = self.plan(read(os.path.join(DEPLOY, "fluid", "examples", "config-multi.json")))
        self.assertEqual(r.returncode, 0, r.stderr)
        p = json.loads(r.stdout)
        self.assertEqual(p["master"], "granary-master-0.granary-master.granary:19998")
        self.assertEqual([m["path"] for m in p["mounts"]], ["/coco", "/web/laion"])
        self.assertEqual(p["mounts"][0]["options"]["fs.oss.accessKeySecret"], "/etc/fluid/secrets/oss-cred/secret")
        self.assertEqual(p["root"], "/")
        self.assertEqual(p["fuse_args"][-2:], ["--fuse.max_threads", "32"])
        self.assertTrue(p["read_only"])

    def test_read_write_many_takes_a_writable_dataset_and_refuses_a_read_only_one(self):
        r = self.plan(read(os.path.join(DEPLOY, "fluid", "examples", "config-checkpoints.json")))
        self.assertEqual(r.returncode, 0, r.stderr)
        p = json.loads(r.stdout)
        self.assertFalse(p["read_only"])
        self.assertEqual(p["writable_mounts"], ["/checkpoints"], "only the mount with write= takes writes")
        self.assertEqual(p["mounts"][0]["options"]["write"], "through")
        self.assertNotIn("write", p["mounts"][1]["options"])
        base = json.loads(read(os.path.join(DEPLOY, "fluid", "examples", "config-s3.json")))
        for mode in ("through", "back"):
            for access in ("ReadWriteMany", "ReadWriteOnce"):
                m = {**base["mounts"][0], "options": {**base["mounts"][0]["options"], "write": mode}}
                r = self.plan({**base, "mounts": [m], "accessModes": [access]})
                self.assertEqual(r.returncode, 0, f"{mode} {access}: {r.stderr}")
                self.assertEqual(json.loads(r.stdout)["writable_mounts"], ["/imagenet"])
        # Read-only (no write option, or write=off): refused, naming the option to set.
        for options in ({}, {"write": "off"}):
            m = {**base["mounts"][0], "options": {**base["mounts"][0]["options"], **options}}
            r = self.plan({**base, "mounts": [m], "accessModes": ["ReadWriteMany"]})
            self.assertNotEqual(r.returncode, 0, options)
            self.assertIn("read-only", r.stderr)
            self.assertIn("write=through or write=back", r.stderr)
        m = {**base["mounts"][0], "options": {"write": "sometimes"}}
        r = self.plan({**base, "mounts": [m]})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("mounts[0].options.write: 'sometimes' is not off, through or back", r.stderr)

    def test_bad_configs_get_clear_errors(self):
        base = json.loads(read(os.path.join(DEPLOY, "fluid", "examples", "config-s3.json")))
        cases = [
            ("not json", "not a JSON object"),
            ({**base, "targetPath": ""}, "no targetPath"),
            ({**base, "mounts": []}, "no mounts"),
            ({**base, "accessModes": ["ReadWriteMany"]}, "mounts[].options.write"),
            ({**base, "runtimeOptions": {"colour": "blue"}}, "not a Granary option"),
            ({**base, "mounts": [{**base["mounts"][0], "encryptOptions": [
                {"name": "password", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}, "known:"),
            ({**base, "mounts": [{**base["mounts"][0], "encryptOptions": [
                {"name": "access_key", "valueFrom": {"secretKeyRef": {"name": "../etc", "key": "k"}}}]}]},
             "secretKeyRef"),
            ({**base, "mounts": [{**base["mounts"][0], "options": {"secret_key": "inline!"}}]}, "encryptOptions"),
        ]
        for config, says in cases:
            r = self.plan(config)
            self.assertNotEqual(r.returncode, 0, config)
            self.assertIn(says, r.stderr, config)
            self.assertNotIn("inline!", r.stderr + r.stdout, "a secret value is never echoed")

    def test_fluid_manifests(self):
        kinds = []
        for name in ("thinruntimeprofile.yaml", "dataset.yaml", "dataload.yaml", "checkpoints.yaml"):
            with open(os.path.join(DEPLOY, "fluid", name)) as f:
                kinds += [d["kind"] for d in yaml.safe_load_all(f) if d]
        self.assertEqual(sorted(set(kinds)), ["DataLoad", "Dataset", "Job", "ThinRuntime", "ThinRuntimeProfile"])
        with open(os.path.join(DEPLOY, "fluid", "checkpoints.yaml")) as f:
            ds = next(d for d in yaml.safe_load_all(f) if d and d["kind"] == "Dataset")
        self.assertEqual(ds["spec"]["accessModes"], ["ReadWriteMany"])
        self.assertEqual([m.get("options", {}).get("write") for m in ds["spec"]["mounts"]], ["through", None])


class ImageTest(unittest.TestCase):
    def test_runtime_packages_cover_every_library_the_binaries_load(self):
        with open(os.path.join(DEPLOY, "docker", "Dockerfile")) as f:
            text = f.read()
        block = text.split("# runtime-packages:begin")[1].split("# runtime-packages:end")[0]
        listed = set(re.findall(r"\b(lib[\w.+-]+|fuse3|ca-certificates)\b", block))
        libs = set()
        for b in ("granary", "granary-master", "granary-worker", "granary-fuse"):
            out = run(["ldd", os.path.join(BIN, b)]).stdout
            for lib in re.findall(r"=> (/\S+)", out):
                libs.add(lib)
        # dpkg knows files by the path it installed them at (/lib/... or /usr/lib/...), one call for all.
        paths = sorted(libs | {os.path.realpath(lib) for lib in libs} |
                       {lib.replace("/lib/", "/usr/lib/", 1) for lib in libs if lib.startswith("/lib/")})
        owners = run(["dpkg", "-S", *paths]).stdout
        needed = set()
        for line in owners.splitlines():
            pkg = line.split(":")[0].strip()
            if pkg and pkg not in ("libc6", "libgcc-s1", "libstdc++6", "zlib1g"):
                needed.add(pkg)
        self.assertTrue(needed, "dpkg found the binaries' libraries")
        # Debian's slim image has libc, libgcc, libstdc++ and zlib; everything else is listed, directly
        # or as a dependency of a listed package (apt pulls those in).
        r = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                 "--no-breaks", "--no-replaces", "--no-enhances", *sorted(listed)], timeout=300)
        deps = {line.strip().split(":")[-1].strip() for line in r.stdout.splitlines()}
        missing = sorted(p for p in needed if p not in listed and p not in deps)
        self.assertEqual(missing, [], "add these to the Dockerfile's runtime packages")
        self.assertIn("USER granary", text)
        self.assertRegex(text, r"FROM debian:12 AS build")


class EntrypointCommandLineTest(unittest.TestCase):
    """The command line each role of the entrypoint execs, with fake binaries in GRANARY_BIN that
    record how they were called (no build needed)."""

    FAKE = """#!/usr/bin/python3
import json, os, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if name == "granary" and "config" in args:
    print({"worker.listen": "0.0.0.0:29999", "fuse.mountpoint": "/nowhere"}[args[args.index("--get") + 1]])
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([name] + args) + "\\n")
"""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="granary-entry-cli-")
        self.bin = os.path.join(self.dir, "bin")
        os.makedirs(self.bin)
        for name in ("granary", "granary-master", "granary-worker", "granary-fuse"):
            path = os.path.join(self.bin, name)
            with open(path, "w") as f:
                f.write(self.FAKE)
            os.chmod(path, 0o755)
        self.config = os.path.join(self.dir, "granary.yaml")
        with open(self.config, "w") as f:
            f.write("{}\n")
        self.log = os.path.join(self.dir, "calls")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GRANARY_")}
        self.env.update(GRANARY_BIN=self.bin, GRANARY_CONFIG=self.config, FAKE_LOG=self.log)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.dir], check=False)

    def call(self, *args, **env):
        if os.path.exists(self.log):
            os.remove(self.log)
        r = run([ENTRYPOINT, *args], env={**self.env, **env})
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.log) as f:
            return [json.loads(line) for line in f][-1]

    def test_daemon_roles(self):
        cfg = ["--config", self.config]
        self.assertEqual(self.call("master", "--x", "1"), ["granary-master", *cfg, "--x", "1"])
        self.assertEqual(self.call("worker"), ["granary-worker", *cfg])
        self.assertEqual(self.call("worker", GRANARY_ADVERTISE_HOST="10.1.2.3"),
                         ["granary-worker", *cfg, "--worker.advertise", "10.1.2.3:29999"])
        self.assertEqual(self.call("fuse", "--x", "1"), ["granary-fuse", *cfg, "--x", "1"])
        self.assertEqual(self.call("fuse", "--x", "1", GRANARY_WORKER_HOST="10.1.2.3"),
                         ["granary-fuse", *cfg, "--fuse.worker", "10.1.2.3:29999", "--x", "1"],
                         "the node's worker at the node's IP and worker.listen's port")
        self.assertEqual(self.call("fluid-fuse", "--fluid-config", "f.json"),
                         ["granary", *cfg, "fluid-fuse", "--fluid-config", "f.json"])

    def test_fuse_keeper(self):
        sock = os.path.join(self.dir, "keeper", "run", "keeper.sock")
        self.assertEqual(self.call("fuse-keeper", GRANARY_KEEPER_SOCKET=sock), ["granary-fuse", "--keeper", sock],
                         "no config: the keeper needs none")
        self.assertEqual(os.stat(os.path.dirname(sock)).st_mode & 0o777, 0o700, "a private directory")
        self.assertEqual(self.call("fuse-keeper", GRANARY_KEEPER_SOCKET=sock), ["granary-fuse", "--keeper", sock],
                         "the directory may be there already (an emptyDir)")
        # The default, without running it (it would make /run/granary-keeper on this machine).
        self.assertIn('${GRANARY_KEEPER_SOCKET:-/run/granary-keeper/keeper.sock}', read(ENTRYPOINT))

    def test_usage_prints_the_whole_comment_block(self):
        r = run([ENTRYPOINT], env=self.env)
        self.assertEqual(r.returncode, 2)
        lines = read(ENTRYPOINT).splitlines()
        block = lines[1:next(i for i, line in enumerate(lines) if i and not line.startswith("#"))]
        self.assertEqual(r.stderr.splitlines(), block)
        for role in ("master", "worker", "fuse", "fuse-keeper", "fuse-stop", "fluid-fuse"):
            self.assertRegex(r.stderr, rf"granary-entrypoint [\w|-]*\b{role}\b", role)


class EntrypointTest(unittest.TestCase):
    """The image's entrypoint, run here as the pods run it: master, worker, FUSE and its keeper from
    one config file, a real mount, the unmount by hand, and Fluid's FUSE role from a Fluid
    config.json."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="granary-entry-")
        self.procs = []
        self.mounts = []
        os.makedirs(os.path.join(self.dir, "data", "ds"))
        self.payload = os.urandom(300_000)
        with open(os.path.join(self.dir, "data", "ds", "x.bin"), "wb") as f:
            f.write(self.payload)
        self.config = os.path.join(self.dir, "granary.yaml")
        with open(self.config, "w") as f:
            f.write(f"""master:
  listen: "127.0.0.1:0"
  data_dir: {self.dir}/master
  metrics_listen: "127.0.0.1:0"
worker:
  listen: "127.0.0.1:0"
  metrics_listen: "127.0.0.1:0"
  heartbeat_interval: 200ms
  local_socket: {self.dir}/worker.sock
  tieredstore:
    levels:
      - {{mediumtype: SSD, path: {self.dir}/cache, quota: 1Gi}}
fuse:
  mountpoint: {self.dir}/fuse/granary
  metrics_listen: "127.0.0.1:0"
  keep_cache: false
ufs:
  local_roots: {self.dir}/data
""")
        self.env = {**os.environ, "GRANARY_CONFIG": self.config, "GRANARY_BIN": BIN,
                    "GRANARY_HOME": os.path.join(self.dir, "home")}

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        for m in self.mounts:
            if mounted(m):
                subprocess.run(["umount", "-l", m], check=False)
        subprocess.run(["rm", "-rf", self.dir], check=False)

    def start(self, *args, name, env=None):
        with open(os.path.join(self.dir, name + ".log"), "w") as log:
            p = subprocess.Popen([ENTRYPOINT, *args], env={**self.env, **(env or {})}, stdout=log,
                                 stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def ready(self, path, proc):
        wait_for(lambda: os.path.exists(path) or proc.poll() is not None, what=path)
        self.assertIsNone(proc.poll(), read(path.replace(".addr", ".log")))
        return read(path).strip()

    def fluid_dataset(self, name, runtime_options):
        """Fluid's config.json (f"{dir}/fluid.json") for one read-only mount `name` of data/ds, at a
        targetPath made here and unmounted at the end; returns the targetPath."""
        target = f"{self.dir}/runtime-mnt/thin/default/{name}/thin-fuse"
        os.makedirs(target)
        self.mounts.append(target)
        with open(f"{self.dir}/fluid.json", "w") as fh:
            json.dump({"mounts": [{"mountPoint": f"file://{self.dir}/data/ds", "name": name}], "targetPath": target,
                       "runtimeOptions": runtime_options, "accessModes": ["ReadOnlyMany"]}, fh)
        return target

    def stop_all(self, fluid, target, *daemons):
        """SIGTERM to Fluid's FUSE role (it unmounts `target`), then to the daemons: each exits 0."""
        fluid.send_signal(signal.SIGTERM)
        self.assertEqual(fluid.wait(timeout=30), 0)
        self.assertFalse(mounted(target))
        for p in daemons:
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=30), 0)

    def cli(self, *args):
        return run([os.path.join(BIN, "granary"), "--master", self.master, *args], env=self.env)

    def test_the_pods_roles_run_the_real_binaries(self):
        d = self.dir
        m = self.start("master", "--ready-file", f"{d}/master.addr", name="master")
        self.master = self.ready(f"{d}/master.addr", m)
        w = self.start("worker", "--master.address", self.master, "--ready-file", f"{d}/worker.addr", name="worker")
        worker = self.ready(f"{d}/worker.addr", w)
        r = self.cli("mount", "/ds", f"file://{d}/data/ds")
        self.assertEqual(r.returncode, 0, r.stderr)
        mountpoint = f"{d}/fuse/granary"
        os.makedirs(mountpoint)
        self.mounts.append(mountpoint)
        f = self.start("fuse", "--master.address", self.master, "--fuse.worker", worker, "--ready-file",
                       f"{d}/fuse.addr", name="fuse")
        self.ready(f"{d}/fuse.addr", f)
        with open(f"{mountpoint}/ds/x.bin", "rb") as fh:
            self.assertEqual(fh.read(), self.payload)
        # readiness as the probes see it
        for name in ("master", "worker", "fuse"):
            addr = read(f"{d}/{name}.addr.metrics").strip()
            r = run(["python3", "-c", f"import urllib.request;print(urllib.request.urlopen('http://{addr}/readyz').status)"])
            self.assertEqual(r.stdout.strip(), "200", name + r.stderr)

        # fuse-stop (by hand): the mount goes, and granary-fuse ends by itself.
        stop = run([ENTRYPOINT, "fuse-stop"], env=self.env)
        self.assertEqual(stop.returncode, 0, stop.stderr)
        wait_for(lambda: not mounted(mountpoint), what="the unmount")
        wait_for(lambda: f.poll() is not None, what="granary-fuse to exit")

        # Fluid's FUSE role: the Dataset from config.json, mounted at Fluid's targetPath.
        os.makedirs(f"{d}/secrets/cred")
        target = self.fluid_dataset("ds2", {"master": self.master, "granary.fuse.worker": worker})
        fl = self.start("fluid-fuse", "--fluid-config", f"{d}/fluid.json", "--secrets-dir", f"{d}/secrets",
                        name="fluid")
        wait_for(lambda: mounted(target) or fl.poll() is not None, what="the Fluid mount")
        self.assertTrue(mounted(target), read(f"{d}/fluid.log"))
        with open(f"{target}/x.bin", "rb") as fh:
            self.assertEqual(fh.read(), self.payload, "the dataset is the root of Fluid's target path")
        self.assertIn("/ds2", self.cli("mounts").stdout)
        self.stop_all(fl, target, w, m)

    def test_the_fluid_profile_reads_from_a_master_that_requires_a_token(self):
        """Issue 54: the ThinRuntimeProfile gave Fluid's FUSE pods no token, so a token-protected
        master refused them. The FUSE container is started as the profile starts it (its command,
        args and env; its volume of the token Secret mapped to a directory here; no config file, as
        in a Fluid pod) against a master and worker that require the token, and reads the file.
        Without the profile's args it is refused, saying so."""
        d = self.dir
        with open(os.path.join(DEPLOY, "fluid", "thinruntimeprofile.yaml")) as f:
            profile = next(x for x in yaml.safe_load_all(f) if x and x["kind"] == "ThinRuntimeProfile")
        fuse = profile["spec"]["fuse"]
        mounts = {m["name"]: m["mountPath"] for m in fuse.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in profile["spec"].get("volumes", [])}
        self.assertTrue(mounts, "the profile mounts the token Secret")
        secret_dir = f"{d}/pod-secrets"
        os.makedirs(secret_dir, mode=0o700)
        token = f"{secret_dir}/token"
        for name, path in mounts.items():
            self.assertEqual(volumes[name]["secret"]["secretName"], "granary-secrets")
            self.assertIn({"key": "token", "path": "token"}, volumes[name]["secret"]["items"])
            self.assertEqual(path, "/etc/granary/secrets")
        with open(token, "w") as fh:
            fh.write(os.urandom(16).hex() + "\n")
        os.chmod(token, 0o400)
        with open(f"{d}/cli.yaml", "w") as fh:
            fh.write(f"rpc:\n  token_file: {token}\n")
        tok = ["--rpc.token_file", token]
        m = self.start("master", *tok, "--ready-file", f"{d}/master.addr", name="master")
        self.master = self.ready(f"{d}/master.addr", m)
        w = self.start("worker", *tok, "--master.address", self.master, "--ready-file", f"{d}/worker.addr",
                       name="worker")
        worker = self.ready(f"{d}/worker.addr", w)
        os.makedirs(f"{d}/secrets")
        target = self.fluid_dataset("ds3", {"granary.fuse.worker": worker, "granary.fuse.metrics_listen": "127.0.0.1:0"})
        # As the pod runs it: the profile's command and args (paths in the Secret's volume mapped
        # here), its env (GRANARY_MASTER: this master), no config file.
        args = [a.replace("/etc/granary/secrets", secret_dir) for a in fuse.get("args", [])]
        env = {e["name"]: e["value"] for e in fuse.get("env", [])}
        env.update({"GRANARY_MASTER": self.master, "GRANARY_CONFIG": f"{d}/no-config.yaml"})
        self.assertEqual(os.path.basename(fuse["command"][0]), "granary-entrypoint")
        self.assertEqual(fuse["command"][1:], ["fluid-fuse"])
        without = run([ENTRYPOINT, "fluid-fuse", "--fluid-config", f"{d}/fluid.json", "--secrets-dir",
                       f"{d}/secrets"], env={**self.env, **env})
        self.assertNotEqual(without.returncode, 0, "a master requiring a token answered a call without it")
        self.assertIn("token", without.stderr, without.stderr)
        fl = self.start("fluid-fuse", *args, "--fluid-config", f"{d}/fluid.json", "--secrets-dir", f"{d}/secrets",
                        name="fluid", env=env)
        wait_for(lambda: mounted(target) or fl.poll() is not None, what="the Fluid mount")
        self.assertTrue(mounted(target), read(f"{d}/fluid.log"))
        with open(f"{target}/x.bin", "rb") as fh:
            self.assertEqual(fh.read(), self.payload)
        r = run([os.path.join(BIN, "granary"), "--config", f"{d}/cli.yaml", "--master", self.master, "mounts"],
                env=self.env)
        self.assertIn("/ds3", r.stdout, r.stderr)
        self.assertNotIn(read(token).strip(), read(f"{d}/fluid.log"), "the token never shows in a log")
        self.stop_all(fl, target, w, m)

    def test_a_fluid_read_write_many_dataset_takes_writes(self):
        """Fluid's FUSE role for a Dataset with accessModes ReadWriteMany and write=through: a file
        written at Fluid's targetPath is whole in the store when close() returns, `granary mounts`
        shows the mount writable, and a Dataset asking for another write mode of the same mount is
        refused instead of mounting it differently."""
        d = self.dir
        m = self.start("master", "--ready-file", f"{d}/master.addr", name="master")
        self.master = self.ready(f"{d}/master.addr", m)
        w = self.start("worker", "--master.address", self.master, "--ready-file", f"{d}/worker.addr", name="worker")
        worker = self.ready(f"{d}/worker.addr", w)
        os.makedirs(f"{d}/data/out")
        target = f"{d}/runtime-mnt/thin/default/training/thin-fuse"
        os.makedirs(target)
        self.mounts.append(target)
        os.makedirs(f"{d}/secrets")
        fluid = {"mounts": [{"mountPoint": f"file://{d}/data/out", "name": "ckpt", "options": {"write": "through"}}],
                 "targetPath": target, "runtimeOptions": {"master": self.master, "granary.fuse.worker": worker},
                 "accessModes": ["ReadWriteMany"]}
        with open(f"{d}/fluid.json", "w") as fh:
            json.dump(fluid, fh)
        fl = self.start("fluid-fuse", "--fluid-config", f"{d}/fluid.json", "--secrets-dir", f"{d}/secrets",
                        name="fluid")
        wait_for(lambda: mounted(target) or fl.poll() is not None, what="the Fluid mount")
        self.assertTrue(mounted(target), read(f"{d}/fluid.log"))
        ckpt = os.urandom(200_000)
        with open(f"{target}/step-100.pt", "wb") as fh:
            fh.write(ckpt)
        with open(f"{d}/data/out/step-100.pt", "rb") as fh:
            self.assertEqual(fh.read(), ckpt, "write=through: whole in the store once close() returned")
        line = next((x for x in self.cli("mounts").stdout.splitlines() if x.startswith("/ckpt ")), "")
        self.assertEqual(line.split()[2:3], ["through"], line)

        # The same mount asked read-only by another Dataset: refused, the mount left as it is.
        with open(f"{d}/fluid-ro.json", "w") as fh:
            json.dump({**fluid, "mounts": [{**fluid["mounts"][0], "options": {}}], "accessModes": ["ReadOnlyMany"],
                       "targetPath": f"{d}/elsewhere"}, fh)
        r = run([ENTRYPOINT, "fluid-fuse", "--fluid-config", f"{d}/fluid-ro.json", "--secrets-dir", f"{d}/secrets"],
                env=self.env)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/ckpt is already mounted with write=through, the Dataset asks for write=off", r.stderr)

        self.stop_all(fl, target, w, m)

    def test_a_replaced_fuse_pod_reaches_running_training_pods(self):
        """A mount made afresh reaches running pods, with the kernel's real propagation: the FUSE
        pod's directory is a shared mount (Bidirectional), a training pod's view of it is a slave
        bind (HostToContainer). A FUSE process with no keeper killed with -9 leaves a dead mount; the
        next one clears it and mounts again, and the training pod's view shows the new mount
        without being restarted."""
        d = self.dir
        m = self.start("master", "--ready-file", f"{d}/master.addr", name="master")
        self.master = self.ready(f"{d}/master.addr", m)
        w = self.start("worker", "--master.address", self.master, "--ready-file", f"{d}/worker.addr", name="worker")
        worker = self.ready(f"{d}/worker.addr", w)
        self.assertEqual(self.cli("mount", "/ds", f"file://{d}/data/ds").returncode, 0)
        host_dir, pod_view = f"{d}/fuse", f"{d}/pod-data"
        mountpoint = f"{host_dir}/granary"
        os.makedirs(mountpoint)
        os.makedirs(pod_view)
        self.mounts += [mountpoint, f"{pod_view}/granary", pod_view, host_dir]
        for cmd in (["mount", "--bind", host_dir, host_dir], ["mount", "--make-shared", host_dir],
                    ["mount", "--bind", host_dir, pod_view], ["mount", "--make-rslave", pod_view]):
            r = run(cmd)
            self.assertEqual(r.returncode, 0, r.stderr)
        # No keeper: the crash below is one that nothing survives (the keeper's test is further down).
        args = ["--master.address", self.master, "--fuse.worker", worker, "--ready-file", f"{d}/fuse.addr",
                "--fuse.keeper", "off", "--fuse.handover_socket", f"{d}/handover.sock"]
        f1 = self.start("fuse", *args, name="fuse1")
        self.ready(f"{d}/fuse.addr", f1)
        with open(f"{pod_view}/granary/ds/x.bin", "rb") as fh:
            self.assertEqual(fh.read(), self.payload, "the pod sees the mount")
        f1.kill()  # the FUSE pod dies without unmounting
        f1.wait(timeout=30)
        with self.assertRaises(OSError) as dead:
            os.listdir(f"{mountpoint}/ds")  # a request to the daemon (attributes may be cached)
        self.assertEqual(dead.exception.errno, 107, "ENOTCONN: Transport endpoint is not connected")
        os.remove(f"{d}/fuse.addr")
        f2 = self.start("fuse", *args, name="fuse2")
        self.ready(f"{d}/fuse.addr", f2)
        with open(f"{pod_view}/granary/ds/x.bin", "rb") as fh:
            self.assertEqual(fh.read(), self.payload, "the running pod sees the new mount")
        self.assertIn("stale", read(f"{d}/fuse2.log"))
        r = run([ENTRYPOINT, "fuse-stop"], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        wait_for(lambda: f2.poll() is not None, what="granary-fuse to exit")
        self.assertFalse(os.path.exists(f"{pod_view}/granary/ds"), "no dead mount is left in the pod's view")
        for p in (w, m):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=30), 0)


    def reader(self, path, name):
        """A process that reads `path` over and over until told to stop; says how many reads failed.
        Returns (finish, reads): reads() is how many reads it has made so far (its progress file), so
        that a test waits for reads rather than sleeping (a loaded machine starts python slowly)."""
        stop = os.path.join(self.dir, name + ".stop")
        progress = os.path.join(self.dir, name + ".reads")
        code = ("import os, sys, time\n"
                "path, stop, want, progress = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]\n"
                "n = bad = 0\n"
                "while not os.path.exists(stop):\n"
                "    try:\n"
                "        with open(path, 'rb') as f:\n"
                "            bad += len(f.read()) != want\n"
                "    except OSError as e:\n"
                "        bad += 1\n"
                "        print(e, file=sys.stderr, flush=True)\n"
                "    n += 1\n"
                "    with open(progress + '.tmp', 'w') as f:\n"
                "        f.write(str(n))\n"
                "    os.replace(progress + '.tmp', progress)\n"
                "    time.sleep(0.005)\n"
                "print(n, bad)\n")
        p = subprocess.Popen(["python3", "-c", code, path, stop, str(len(self.payload)), progress],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)

        def reads():
            try:
                return int(read(progress) or 0)
            except (OSError, ValueError):
                return 0

        def finish():
            with open(stop, "w"):
                pass
            out, err = p.communicate(timeout=120)
            n, bad = map(int, out.split())
            return n, bad, err
        return finish, reads

    def cat(self, path):
        r = subprocess.run(["cat", path], capture_output=True, timeout=60)  # a hung mount fails, not hangs
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def probe(self, ready_file, path="/readyz"):
        addr = read(ready_file + ".metrics").strip()
        try:
            with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    def test_the_keeper_sidecar_and_the_hand_over(self):
        """The FUSE pod's story in docs/deploy.md, "Upgrades", with the real binaries: the keeper
        run by the entrypoint as the sidecar runs it; an update (a second granary-fuse takes the
        mount over, the first idles not ready and exits on SIGTERM without unmounting); a crash
        (kill -9: the keeper holds the connection, the next granary-fuse takes it over); a keeper
        restart; and the stop for good (SIGTERM to the one serving unmounts). The training pod's
        view reads on throughout."""
        d = self.dir
        m = self.start("master", "--ready-file", f"{d}/master.addr", name="master")
        self.master = self.ready(f"{d}/master.addr", m)
        w = self.start("worker", "--master.address", self.master, "--ready-file", f"{d}/worker.addr", name="worker")
        worker = self.ready(f"{d}/worker.addr", w)
        self.assertEqual(self.cli("mount", "/ds", f"file://{d}/data/ds").returncode, 0)
        host_dir, pod_view = f"{d}/fuse", f"{d}/pod-data"
        mountpoint = f"{host_dir}/granary"
        os.makedirs(mountpoint)
        os.makedirs(pod_view)
        self.mounts += [mountpoint, f"{pod_view}/granary", pod_view, host_dir]
        for cmd in (["mount", "--bind", host_dir, host_dir], ["mount", "--make-shared", host_dir],
                    ["mount", "--bind", host_dir, pod_view], ["mount", "--make-rslave", pod_view]):
            r = run(cmd)
            self.assertEqual(r.returncode, 0, r.stderr)
        sock = f"{d}/keeper/keeper.sock"
        keeper_env = {"GRANARY_KEEPER_SOCKET": sock}
        k = self.start("fuse-keeper", name="keeper", env=keeper_env)
        wait_for(lambda: os.path.exists(sock) or k.poll() is not None, what="the keeper's socket")
        self.assertIsNone(k.poll(), read(f"{d}/keeper.log"))

        def fuse(n):
            return self.start("fuse", "--master.address", self.master, "--fuse.worker", worker,
                              "--fuse.keeper", sock, "--fuse.exit_after_handover", "false",
                              "--fuse.handover_socket", f"{d}/handover.sock", "--ready-file", f"{d}/fuse{n}.addr",
                              name=f"fuse{n}")

        f1 = fuse(1)
        self.ready(f"{d}/fuse1.addr", f1)
        data = f"{pod_view}/granary/ds/x.bin"
        self.assertEqual(self.cat(data), self.payload)
        self.assertEqual(self.probe(f"{d}/fuse1.addr"), 200)

        # The update: the new pod's granary-fuse takes over while a reader reads on.
        done, reads = self.reader(data, "update")
        wait_for(lambda: reads() > 0, what="the reader's first read")
        f2 = fuse(2)
        self.ready(f"{d}/fuse2.addr", f2)
        self.assertEqual(self.probe(f"{d}/fuse2.addr"), 200)
        wait_for(lambda: self.probe(f"{d}/fuse1.addr") == 503, what="the old granary-fuse to report not ready")
        self.assertIsNone(f1.poll(), "exit_after_handover false: the old one idles")
        self.assertEqual(self.probe(f"{d}/fuse1.addr", "/healthz"), 200, "idle, not dead: no liveness restart")
        f1.send_signal(signal.SIGTERM)  # Kubernetes deletes the old pod
        self.assertEqual(f1.wait(timeout=30), 0, read(f"{d}/fuse1.log"))
        self.assertTrue(mounted(mountpoint), "a handed-over granary-fuse does not unmount")
        after = reads()
        wait_for(lambda: reads() > after + 2, what="reads after the hand-over")
        n, bad, err = done()
        self.assertGreater(n, 0)
        self.assertEqual(bad, 0, "readers see no error across the hand-over: " + err)

        # A crash of the fuse container: the keeper keeps the connection, the restarted one takes it.
        done, reads = self.reader(data, "crash")
        wait_for(lambda: reads() > 0, what="the reader's first read")
        f2.kill()
        f2.wait(timeout=30)
        f3 = fuse(3)
        self.ready(f"{d}/fuse3.addr", f3)
        self.assertEqual(self.cat(data), self.payload)
        after = reads()
        wait_for(lambda: reads() > after + 2, what="reads after the restart")
        n, bad, err = done()
        if tuple(map(int, re.findall(r"\d+", os.uname().release)[:2])) >= (6, 9):
            self.assertEqual(bad, 0, "the kernel re-sends what the dead process had read: " + err)
        else:
            self.assertNotIn("not connected", err, "at most EIO for requests the dead process had read")

        # A crash of the keeper: nothing to see; the restarted keeper gets the connection again.
        k.kill()
        k.wait(timeout=30)
        os.remove(sock)
        k = self.start("fuse-keeper", name="keeper2", env=keeper_env)
        wait_for(lambda: os.path.exists(sock) or k.poll() is not None, what="the restarted keeper's socket")
        self.assertEqual(self.cat(data), self.payload)
        self.assertEqual(self.probe(f"{d}/fuse3.addr"), 200)

        # Stop for good: SIGTERM to the granary-fuse that serves unmounts.
        f3.send_signal(signal.SIGTERM)
        self.assertEqual(f3.wait(timeout=30), 0, read(f"{d}/fuse3.log"))
        self.assertFalse(mounted(mountpoint))
        self.assertFalse(os.path.exists(f"{pod_view}/granary/ds"), "no dead mount is left in the pod's view")
        k.send_signal(signal.SIGTERM)
        k.wait(timeout=30)
        for p in (w, m):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=30), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
