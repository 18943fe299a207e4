#include "ufs/s3_xml.h"

#include <tinyxml2.h>

#include <ctime>

namespace granary {
namespace {

std::string Text(const tinyxml2::XMLElement* parent, const char* name) {
  const tinyxml2::XMLElement* e = parent ? parent->FirstChildElement(name) : nullptr;
  return e && e->GetText() ? e->GetText() : "";
}

// The document's root element, or nullptr when the body is not XML or holds no element (a body of
// only a declaration or a comment parses, with no root).
const tinyxml2::XMLElement* Root(tinyxml2::XMLDocument* doc, std::string_view body) {
  if (body.empty() || doc->Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS) return nullptr;
  return doc->RootElement();
}

// A decimal size of at most kMaxListedObjectSize: digits only, no sign, no overflow.
bool ParseSize(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 13) return false;  // 5 TiB has 13 digits
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > kMaxListedObjectSize) return false;
  *out = v;
  return true;
}

}  // namespace

int64_t ParseS3TimeNs(const std::string& s) {
  struct tm tm {};
  if (strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr &&
      strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) == nullptr) {
    return 0;
  }
  time_t t = timegm(&tm);
  // Years a store can mean (1970..2200); anything else would overflow nanoseconds.
  if (t < 0 || t > 7'258'118'400) return 0;
  return static_cast<int64_t>(t) * 1'000'000'000;
}

S3ErrorBody ParseS3Error(std::string_view body) {
  tinyxml2::XMLDocument doc;
  const tinyxml2::XMLElement* root = Root(&doc, body);
  S3ErrorBody out;
  if (root == nullptr || std::string_view(root->Name()) != "Error") return out;
  out.code = Text(root, "Code");
  out.message = Text(root, "Message");
  return out;
}

StatusOr<S3ListPage> ParseS3ListPage(std::string_view body) {
  tinyxml2::XMLDocument doc;
  const tinyxml2::XMLElement* root = Root(&doc, body);
  if (root == nullptr) return InternalError("the listing's answer is not XML");
  if (std::string_view(root->Name()) != "ListBucketResult") {
    return InternalError(std::string("the listing's answer is a <") + root->Name() + ">, not a <ListBucketResult>");
  }
  S3ListPage page;
  for (auto* c = root->FirstChildElement("Contents"); c; c = c->NextSiblingElement("Contents")) {
    S3ListedObject o;
    o.key = Text(c, "Key");
    if (o.key.empty() || !ParseSize(Text(c, "Size"), &o.size)) {
      ++page.skipped;
      continue;
    }
    o.mtime_ns = ParseS3TimeNs(Text(c, "LastModified"));
    o.etag = Text(c, "ETag");
    page.objects.push_back(std::move(o));
  }
  for (auto* c = root->FirstChildElement("CommonPrefixes"); c; c = c->NextSiblingElement("CommonPrefixes")) {
    std::string p = Text(c, "Prefix");
    if (!p.empty()) page.prefixes.push_back(std::move(p));
  }
  page.truncated = Text(root, "IsTruncated") == "true";
  if (page.truncated) {
    page.next_token = Text(root, "NextContinuationToken");
    if (page.next_token.empty()) {
      return InternalError("the listing's answer says it is truncated but names no NextContinuationToken");
    }
  }
  return page;
}

StatusOr<std::string> ParseS3UploadId(std::string_view body) {
  tinyxml2::XMLDocument doc;
  const tinyxml2::XMLElement* root = Root(&doc, body);
  if (root == nullptr) return InternalError("the answer to starting an upload is not XML");
  std::string id = Text(root, "UploadId");
  if (id.empty()) return InternalError("the answer to starting an upload names no UploadId");
  return id;
}

StatusOr<std::string> ParseS3CompleteUpload(std::string_view body) {
  tinyxml2::XMLDocument doc;
  const tinyxml2::XMLElement* root = Root(&doc, body);
  if (root == nullptr) return InternalError("the answer to completing an upload is not XML");
  std::string_view name = root->Name();
  if (name == "Error") {
    return UnavailableError("completing the upload failed: " + Text(root, "Code") + " " + Text(root, "Message"));
  }
  if (name != "CompleteMultipartUploadResult") {
    return InternalError("the answer to completing an upload is a <" + std::string(name) +
                         ">, not a <CompleteMultipartUploadResult>");
  }
  return Text(root, "ETag");
}

}  // namespace granary
