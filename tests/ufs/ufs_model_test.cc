// Reference-model test of how object keys become a tree: random key sets (with the odd keys object
// stores allow: empty segments from "//", ".", "..", names over 255 bytes, directory markers, an
// object beside a "directory" of the same name) are listed through S3Ufs against an in-memory S3
// (ListObjectsV2 over a fake HttpClient, paged) and compared, entry by entry, with a model written
// from the rules in ufs/s3_ufs.h. The model's tree is also built on disk and listed through
// LocalUfs, which must show the same tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ufs/local_ufs.h"
#include "ufs/s3_ufs.h"
#include "tests/testutil/testutil.h"
#include "tests/ufs/s3_test_settings.h"

namespace granary {
namespace {

// path ("a/b") -> size, or -1 for a directory.
using Tree = std::map<std::string, int64_t>;

bool ValidName(const std::string& n) { return !n.empty() && n != "." && n != ".." && n.size() <= 255 && n.find('/') == std::string::npos; }

// The rules of ufs/s3_ufs.h: a key's leading segments are directories while they are valid names
// (an invalid one hides everything below it); its last segment is a file if valid ("x/" is only a
// marker); an object whose path is also a directory is hidden by it.
Tree Model(const std::map<std::string, int64_t>& objects) {
  Tree dirs, files;
  for (const auto& [key, size] : objects) {
    std::vector<std::string> seg;
    size_t start = 0;
    for (;;) {
      size_t slash = key.find('/', start);
      seg.push_back(key.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    std::string path;
    bool ok = true;
    for (size_t i = 0; i + 1 < seg.size() && ok; ++i) {
      if (!ValidName(seg[i])) ok = false;
      else {
        path += (path.empty() ? "" : "/") + seg[i];
        dirs[path] = -1;
      }
    }
    if (ok && ValidName(seg.back())) files[path + (path.empty() ? "" : "/") + seg.back()] = size;
  }
  Tree out = dirs;
  for (const auto& [p, size] : files) {
    if (!dirs.count(p)) out[p] = size;
  }
  return out;
}

std::string XmlEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string UrlDecode(const std::string& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      o += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      o += s[i];
    }
  }
  return o;
}

// An S3 bucket in memory: ListObjectsV2 (prefix, delimiter, max-keys, continuation-token,
// start-after).
class FakeS3 : public HttpClient {
 public:
  explicit FakeS3(std::map<std::string, int64_t> objects) : objects_(std::move(objects)) {}
  StatusOr<HttpResponse> Send(const HttpRequest& req) override {
    std::map<std::string, std::string> q;
    size_t qs = req.url.find('?');
    if (qs != std::string::npos) {
      std::string rest = req.url.substr(qs + 1);
      size_t start = 0;
      while (start <= rest.size()) {
        size_t amp = rest.find('&', start);
        std::string kv = rest.substr(start, amp == std::string::npos ? std::string::npos : amp - start);
        size_t eq = kv.find('=');
        if (eq != std::string::npos) q[UrlDecode(kv.substr(0, eq))] = UrlDecode(kv.substr(eq + 1));
        if (amp == std::string::npos) break;
        start = amp + 1;
      }
    }
    HttpResponse r;
    if (req.method != "GET" || q["list-type"] != "2") {
      r.status = 404;
      return r;
    }
    const std::string prefix = q["prefix"], delim = q["delimiter"];
    const std::string after = q.count("continuation-token") ? q["continuation-token"] : q["start-after"];
    size_t max = q.count("max-keys") ? std::stoul(q["max-keys"]) : 1000;
    std::string contents, prefixes, last;
    size_t n = 0;
    bool truncated = false;
    std::string skip_prefix;
    for (auto it = objects_.lower_bound(prefix); it != objects_.end(); ++it) {
      const std::string& key = it->first;
      if (key.compare(0, prefix.size(), prefix) != 0) break;
      if (!after.empty() && key <= after) continue;
      if (!skip_prefix.empty() && key.compare(0, skip_prefix.size(), skip_prefix) == 0) continue;
      if (n == max) {
        truncated = true;
        break;
      }
      size_t d = delim.empty() ? std::string::npos : key.find(delim, prefix.size());
      if (d != std::string::npos) {
        std::string cp = key.substr(0, d + delim.size());
        prefixes += "<CommonPrefixes><Prefix>" + XmlEscape(cp) + "</Prefix></CommonPrefixes>";
        skip_prefix = cp;
        last = cp + "\xff";  // past every key below the common prefix
      } else {
        contents += "<Contents><Key>" + XmlEscape(key) + "</Key><Size>" + std::to_string(it->second) +
                    "</Size><ETag>\"e" + std::to_string(it->second) +
                    "\"</ETag><LastModified>2026-01-01T00:00:00.000Z</LastModified></Contents>";
        last = key;
      }
      ++n;
    }
    r.status = 200;
    r.body = "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>" + std::string(truncated ? "true" : "false") +
             "</IsTruncated>" + (truncated ? "<NextContinuationToken>" + XmlEscape(last) + "</NextContinuationToken>" : "") +
             contents + prefixes + "</ListBucketResult>";
    ++lists;
    return r;
  }
  int lists = 0;

 private:
  std::map<std::string, int64_t> objects_;
};

// The whole tree below "" through List, depth first.
Status Walk(UnderFileSystem& ufs, const std::string& dir, size_t page, Tree* out) {
  std::vector<std::string> subdirs;
  RETURN_IF_ERROR(ufs.List(dir, page, [&](std::vector<UfsEntry>& entries) -> Status {
    for (const auto& e : entries) {
      std::string p = dir.empty() ? e.name : dir + "/" + e.name;
      if (out->count(p)) return InternalError("listed twice: " + p);
      (*out)[p] = e.is_dir ? -1 : static_cast<int64_t>(e.size);
      if (e.is_dir) subdirs.push_back(p);
    }
    return Status::OK();
  }));
  for (const auto& d : subdirs) RETURN_IF_ERROR(Walk(ufs, d, page, out));
  return Status::OK();
}

std::string Describe(const Tree& t) {
  std::string s;
  for (const auto& [p, size] : t) s += "  " + p + (size < 0 ? "/" : " " + std::to_string(size)) + "\n";
  return s;
}

std::map<std::string, int64_t> RandomKeys(std::mt19937_64& rng) {
  const std::vector<std::string> names = {"a", "b", "c", "img.jpg", "", ".", "..", std::string(256, 'x'), "d d"};
  std::uniform_int_distribution<int> pick(0, static_cast<int>(names.size()) - 1), depth(1, 3), count(1, 25);
  std::map<std::string, int64_t> keys;
  int n = count(rng);
  for (int i = 0; i < n; ++i) {
    std::string key;
    int d = depth(rng);
    for (int j = 0; j < d; ++j) {
      // Odd names only now and then, so most sets have a tree worth comparing.
      std::string name = names[rng() % 5 == 0 ? pick(rng) : rng() % 4];
      key += (j ? "/" : "") + name;
    }
    if (rng() % 7 == 0) key += "/";  // a directory marker
    if (key.empty()) continue;
    keys[key] = static_cast<int64_t>(rng() % 1000);
  }
  return keys;
}

// A bucket in memory holding `objects` under the prefix "mnt", with one key outside it (never
// listed), opened as a mount of s3://bkt/mnt sees it.
StatusOr<std::shared_ptr<UnderFileSystem>> OpenFakeBucket(const std::map<std::string, int64_t>& objects) {
  std::map<std::string, int64_t> stored;
  for (const auto& [k, v] : objects) stored["mnt/" + k] = v;
  stored["other/outside"] = 1;
  S3Settings s = testing::FakeS3Settings("mnt");
  return S3Ufs::Open("s3://bkt/mnt", s, std::make_shared<FakeS3>(stored));
}

// The tree `t` on disk at `root` (files of their sizes).
void MakeOnDisk(const Tree& t, const std::string& root) {
  std::filesystem::create_directories(root);
  for (const auto& [p, size] : t) {
    if (size < 0) {
      std::filesystem::create_directories(root + "/" + p);
    } else {
      testing::WriteFile(root + "/" + p, std::string(static_cast<size_t>(size), 'z'));
    }
  }
}

TEST(UfsModel, S3ListingsMatchTheModelForRandomKeySets) {
  std::mt19937_64 rng(20261123);
  int compared = 0;
  for (int round = 0; round < 300; ++round) {
    auto objects = RandomKeys(rng);
    Tree want = Model(objects);
    auto ufs = OpenFakeBucket(objects);
    ASSERT_TRUE(ufs.ok()) << ufs.status().ToString();
    for (size_t page : {size_t{2}, size_t{1000}}) {  // small pages cross every paging edge
      Tree got;
      Status st = Walk(**ufs, "", page, &got);
      ASSERT_TRUE(st.ok()) << st.ToString();
      std::string keys;
      for (const auto& [k, v] : objects) keys += "  '" + (k.size() > 40 ? k.substr(0, 40) + "..." : k) + "'\n";
      ASSERT_EQ(got, want) << "keys:\n" << keys << "S3Ufs listed:\n" << Describe(got) << "the model:\n" << Describe(want);
    }
    ++compared;

    // The same tree on disk, through LocalUfs.
    testing::TempDir dir;
    MakeOnDisk(want, dir / "root");
    auto local = LocalUfs::Open(dir / "root");
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    Tree on_disk;
    ASSERT_TRUE(Walk(**local, "", 3, &on_disk).ok());
    ASSERT_EQ(on_disk, want) << "LocalUfs listed:\n" << Describe(on_disk) << "the model:\n" << Describe(want);
  }
  EXPECT_EQ(compared, 300);
}

std::string ParentOf(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

// ListTree cut after every page and resumed from that page's checkpoint (its last entry's name, with
// a '/' for a directory): together the two parts pass every entry. S3Ufs passes exactly what the
// whole listing passed after the cut; the walk with List passes again only, when the checkpoint is
// a file, the other files of its directory.
void ExpectResumesAfterEveryPage(UnderFileSystem& ufs, size_t page, bool exact, const std::string& what) {
  std::vector<std::string> whole;
  std::vector<bool> is_dir;
  std::vector<size_t> page_ends;
  ASSERT_TRUE(ufs.ListTree("", page, [&](std::vector<UfsEntry>& p) -> Status {
    for (const auto& e : p) {
      whole.push_back(e.name);
      is_dir.push_back(e.is_dir);
    }
    page_ends.push_back(whole.size());
    return Status::OK();
  }, "").ok());
  const std::set<std::string> all(whole.begin(), whole.end());
  ASSERT_EQ(all.size(), whole.size()) << what << ": an entry passed twice";
  for (size_t cut : page_ends) {
    const std::string token = whole[cut - 1] + (is_dir[cut - 1] ? "/" : "");
    std::vector<std::string> rest;
    std::vector<bool> rest_dir;
    Status st = ufs.ListTree("", page, [&](std::vector<UfsEntry>& p) -> Status {
      for (const auto& e : p) {
        rest.push_back(e.name);
        rest_dir.push_back(e.is_dir);
      }
      return Status::OK();
    }, token);
    ASSERT_TRUE(st.ok()) << what << " after '" << token << "': " << st.ToString();
    const std::vector<std::string> want(whole.begin() + static_cast<long>(cut), whole.end());
    if (exact) {
      EXPECT_EQ(rest, want) << what << " resumed after '" << token << "'";
      continue;
    }
    std::set<std::string> got(whole.begin(), whole.begin() + static_cast<long>(cut));
    got.insert(rest.begin(), rest.end());
    EXPECT_EQ(got, all) << what << " resumed after '" << token << "'";
    const std::set<std::string> before(whole.begin(), whole.begin() + static_cast<long>(cut));
    for (size_t i = 0; i < rest.size(); ++i) {
      if (!before.count(rest[i])) continue;
      bool sibling_file = !is_dir[cut - 1] && !rest_dir[i] && ParentOf(rest[i]) == ParentOf(whole[cut - 1]);
      EXPECT_TRUE(sibling_file) << what << ": '" << rest[i] << "' passed again after '" << token << "'";
    }
    // What was not passed before comes in the whole listing's order.
    std::vector<std::string> fresh;
    for (const auto& e : rest) {
      if (!before.count(e)) fresh.push_back(e);
    }
    EXPECT_EQ(fresh, want) << what << " resumed after '" << token << "'";
  }
}

TEST(UfsModel, TreeListingsResumeAfterEveryPage) {
  std::mt19937_64 rng(20261125);
  for (int round = 0; round < 60; ++round) {
    auto objects = RandomKeys(rng);
    Tree want = Model(objects);
    auto ufs = OpenFakeBucket(objects);
    ASSERT_TRUE(ufs.ok()) << ufs.status().ToString();
    ExpectResumesAfterEveryPage(**ufs, 2, true, "S3Ufs, round " + std::to_string(round));
    // An object hidden by a directory of the same name is not passed (a bulk load would replace
    // the directory with it, then the file with the directory again).
    ASSERT_TRUE((*ufs)->ListTree("", 2, [&](std::vector<UfsEntry>& p) -> Status {
      for (const auto& e : p) {
        auto it = want.find(e.name);
        EXPECT_FALSE(!e.is_dir && it != want.end() && it->second < 0) << "round " << round << ": file '" << e.name
                                                                      << "' passed though a directory hides it";
      }
      return Status::OK();
    }, "").ok());

    testing::TempDir dir;
    MakeOnDisk(want, dir / "root");
    auto local = LocalUfs::Open(dir / "root");
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    for (size_t page : {size_t{1}, size_t{3}}) {
      ExpectResumesAfterEveryPage(**local, page, false, "LocalUfs, round " + std::to_string(round));
    }
  }
}

// ReadProgress: waiters that need different amounts each return once theirs landed (the store's
// pieces wake them only then), or when the read finished short; none is left waiting.
TEST(ReadProgress, EachWaiterReturnsWhenItsBytesLandedOrTheReadFinished) {
  for (int round = 0; round < 50; ++round) {
    ReadProgress p;
    std::vector<uint64_t> need = {1000, 64 << 10, 1 << 20, 3 << 20, 5 << 20};  // the last never lands
    std::vector<uint64_t> got(need.size(), 0);
    std::vector<std::thread> waiters;
    for (size_t i = 0; i < need.size(); ++i) waiters.emplace_back([&, i] { got[i] = p.WaitFor(need[i]); });
    for (uint64_t n = 16 << 10; n <= (4 << 20); n += 16 << 10) p.Landed(n);  // curl's pieces
    p.Finish();
    for (auto& t : waiters) t.join();
    for (size_t i = 0; i + 1 < need.size(); ++i) EXPECT_GE(got[i], need[i]) << "waiter " << i;
    EXPECT_EQ(got.back(), uint64_t{4} << 20) << "a read that finished short returns what landed";
  }
}

}  // namespace
}  // namespace granary
