// granary._native: the Python binding of granary::python::Client (python/client.h). Thin: every
// call releases the GIL while it talks to the worker or reads, so threads of one process read in
// parallel; errors become OSError subclasses with the errno a mount would give (FileNotFoundError,
// PermissionError, NotADirectoryError, IsADirectoryError, OSError(ESTALE) for a file that changed
// since it was opened, OSError(EIO) otherwise). The Python side is python/granary/.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>


#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "python/client.h"
#include "rpc/local_wire.h"
#include <unistd.h>

namespace py = pybind11;
using granary::Code;
using granary::Status;
using granary::StatusOr;
using granary::python::Client;
using granary::python::ClientOptions;
using granary::python::Entry;
using granary::python::File;

namespace {

// Open without the GIL released when the entry is cached (no I/O), else with it released.
StatusOr<std::shared_ptr<File>> OpenFile(Client& c, const std::string& path);

// f(), with the GIL released while it runs.
template <typename F>
auto Unlocked(F f) {
  py::gil_scoped_release unlocked;
  return f();
}

int ErrnoOf(const Status& st) {
  if (st.IsVersionChanged()) return ESTALE;
  if (st.reason() == granary::python::kIsDirectory) return EISDIR;
  if (st.reason() == granary::python::kNotDirectory) return ENOTDIR;
  if (st.reason() == granary::python::kNameTooLong) return ENAMETOOLONG;
  if (st.reason() == granary::python::kOtherProcess) return EBADF;
  switch (st.code()) {
    case Code::kNotFound: return ENOENT;
    case Code::kPermissionDenied: return EACCES;
    case Code::kUnauthenticated: return EACCES;
    case Code::kInvalidArgument: return EINVAL;
    case Code::kResourceExhausted: return EMFILE;   // e.g. this user's connections to the worker
    case Code::kUnavailable: return ECONNREFUSED;  // no worker answered (within worker_wait)
    default: return EIO;
  }
}

// Raises st as an OSError (OSError(errno, msg) constructs the matching subclass); `err`: this
// errno rather than st's.
[[noreturn]] void Raise(const Status& st, const std::string& path, int err = 0) {
  py::object e = py::reinterpret_steal<py::object>(
      PyObject_CallFunction(PyExc_OSError, "iss", err != 0 ? err : ErrnoOf(st), st.message().c_str(), path.c_str()));
  if (!e) throw py::error_already_set();
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
  throw py::error_already_set();
}

StatusOr<std::shared_ptr<File>> OpenFile(Client& c, const std::string& path) {
  if (std::shared_ptr<File> f = c.OpenCached(path)) return f;
  return Unlocked([&] { return c.Open(path); });
}

py::dict Info(const std::string& name, const Entry& e) {
  py::dict d;
  d["name"] = name;
  d["size"] = e.attr.size();
  d["type"] = e.attr.type() == granary::rpc::DIRECTORY ? "directory" : "file";
  d["mode"] = e.attr.mode() | (e.attr.type() == granary::rpc::DIRECTORY ? 0040000 : 0100000);
  d["uid"] = e.attr.uid();
  d["gid"] = e.attr.gid();
  d["ino"] = e.attr.ino();
  d["mtime"] = static_cast<double>(e.attr.mtime_ns()) / 1e9;
  d["nlink"] = e.attr.nlink();
  if (e.file != nullptr) d["version"] = e.file->version();
  return d;
}

// Reads [offset, offset+length) of f into a new bytes object, the GIL released meanwhile.
py::bytes ReadBytes(Client& c, File& f, uint64_t offset, int64_t length) {
  const uint64_t size = f.size();
  uint64_t want = offset >= size ? 0 : size - offset;
  if (length >= 0) want = std::min<uint64_t>(want, static_cast<uint64_t>(length));
  PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(want));
  if (b == nullptr) throw py::error_already_set();
  py::bytes out = py::reinterpret_steal<py::bytes>(b);
  if (want == 0) return out;
  auto got = Unlocked([&] { return c.Read(f, offset, want, PyBytes_AS_STRING(b)); });
  if (!got.ok()) Raise(got.status(), f.path);
  if (*got != want) {
    // Only at the end of a file that is the length it was opened with: cannot happen, but a short
    // answer must not show as zeros.
    PyObject* raw = out.release().ptr();  // _PyBytes_Resize may move it (and frees it on failure)
    if (_PyBytes_Resize(&raw, static_cast<Py_ssize_t>(*got)) != 0) throw py::error_already_set();
    return py::reinterpret_steal<py::bytes>(raw);
  }
  return out;
}

// The file object granary.GranaryFileSystem.open returns (binary reads): one version of a file, a
// position, and a read-ahead buffer — a read smaller than `blocksize` fetches that much (the whole
// of a small file) so a parser's many small reads (PIL's, tarfile's) cost one call to the worker;
// larger reads go straight into the result. Its state changes only with the GIL held; the worker
// is asked without it. Used in the process that opened it only (a fork's child opens again).
class PyFile {
 public:
  PyFile(std::shared_ptr<Client> c, std::shared_ptr<File> f, uint64_t blocksize)
      : client_(std::move(c)), file_(std::move(f)), blocksize_(blocksize == 0 ? kDefaultBlock : blocksize) {}
  static constexpr uint64_t kDefaultBlock = 4 << 20;

  // Every method reads its position once and works on copies: the GIL is let go while the worker
  // is asked, and another thread using this object meanwhile (a file object shared between
  // threads) may move the position or the buffer. Each such read returns bytes of the file at the
  // position it started at, never memory from outside the buffer.
  py::bytes Read(int64_t size) {
    Check();
    const uint64_t at = pos_;
    const uint64_t end = file_->size();
    const uint64_t want = at >= end ? 0 : (size < 0 ? end - at : std::min<uint64_t>(static_cast<uint64_t>(size), end - at));
    if (want == 0) return py::bytes();
    if (Covers(at, want)) {
      py::bytes out(buf_->data() + (at - buf_at_), want);
      pos_ = at + want;
      return out;
    }
    if (want >= blocksize_ || want == end - at) {  // large, or the rest of the file: no buffer between
      py::bytes out = ReadBytes(*client_, *file_, at, static_cast<int64_t>(want));
      pos_ = at + static_cast<uint64_t>(PyBytes_GET_SIZE(out.ptr()));
      return out;
    }
    std::shared_ptr<const std::string> b = Fill(at, std::min<uint64_t>(blocksize_, end - at));
    const uint64_t n = std::min<uint64_t>(want, b->size());
    py::bytes out(b->data(), n);
    pos_ = at + n;
    return out;
  }

  uint64_t ReadInto(py::object buffer) {
    Check();
    Py_buffer view;
    if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
    struct Releaser {
      Py_buffer* v;
      ~Releaser() { PyBuffer_Release(v); }
    } releaser{&view};
    const uint64_t at = pos_;
    const uint64_t end = file_->size();
    const uint64_t want = at >= end ? 0 : std::min<uint64_t>(static_cast<uint64_t>(view.len), end - at);
    char* dst = static_cast<char*>(view.buf);
    if (want == 0) return 0;
    uint64_t n = want;
    if (Covers(at, want)) {
      std::memcpy(dst, buf_->data() + (at - buf_at_), want);
    } else if (want >= blocksize_ || want == end - at) {
      File& f = *file_;
      auto got = Unlocked([&] { return client_->Read(f, at, want, dst); });
      if (!got.ok()) Raise(got.status(), f.path);
      n = *got;
    } else {
      std::shared_ptr<const std::string> b = Fill(at, std::min<uint64_t>(blocksize_, end - at));
      n = std::min<uint64_t>(want, b->size());
      std::memcpy(dst, b->data(), n);
    }
    pos_ = at + n;
    return n;
  }

  py::bytes ReadLine(int64_t limit) {
    Check();
    std::string line;
    uint64_t at = pos_;
    const uint64_t end = file_->size();
    while (at < end && (limit < 0 || line.size() < static_cast<uint64_t>(limit))) {
      std::shared_ptr<const std::string> b;
      uint64_t b_at = 0;
      if (Covers(at, 1)) {
        b = buf_;  // shared: another thread may replace buf_, not change these bytes
        b_at = buf_at_;
      } else {
        b = Fill(at, std::min<uint64_t>(blocksize_, end - at));
        b_at = at;
      }
      if (b->empty()) break;
      const char* from = b->data() + (at - b_at);
      uint64_t avail = b->size() - (at - b_at);
      if (limit >= 0) avail = std::min<uint64_t>(avail, static_cast<uint64_t>(limit) - line.size());
      const void* nl = std::memchr(from, '\n', avail);
      const uint64_t take = nl != nullptr ? static_cast<uint64_t>(static_cast<const char*>(nl) - from) + 1 : avail;
      line.append(from, take);
      at += take;
      if (nl != nullptr) break;
    }
    pos_ = at;
    return py::bytes(line);
  }

  uint64_t Seek(int64_t offset, int whence) {
    Check();
    int64_t base = whence == 0 ? 0 : whence == 1 ? static_cast<int64_t>(pos_) : whence == 2 ? static_cast<int64_t>(file_->size()) : -1;
    if (base < 0) throw py::value_error("invalid whence (" + std::to_string(whence) + ", should be 0, 1 or 2)");
    if (base + offset < 0) Raise(granary::InvalidArgumentError("negative seek position " + std::to_string(base + offset)), file_->path, EINVAL);
    pos_ = static_cast<uint64_t>(base + offset);
    return pos_;
  }
  uint64_t Tell() {
    Check();
    return pos_;
  }
  void Close() {
    closed_ = true;
    buf_ = std::make_shared<const std::string>();
    buf_at_ = 0;
  }
  bool closed() const { return closed_; }
  const File& file() const { return *file_; }

 private:
  void Check() {
    if (closed_) throw py::value_error("I/O operation on closed file");
    if (client_->Forked()) {
      Raise(granary::FailedPreconditionError("opened in another process (before a fork): open it again here"),
            file_->path, EBADF);
    }
  }
  // [at, at + n) is in the buffer.
  bool Covers(uint64_t at, uint64_t n) const { return at >= buf_at_ && at - buf_at_ + n <= buf_->size() && !buf_->empty(); }
  // Reads [at, at + n) (fewer at the end) with the GIL let go, makes it the buffer, and returns
  // those bytes (a copy the caller keeps even if another thread replaces the buffer).
  std::shared_ptr<const std::string> Fill(uint64_t at, uint64_t n) {
    auto fresh = std::make_shared<std::string>(n, '\0');
    File& f = *file_;
    auto got = Unlocked([&] { return client_->Read(f, at, n, fresh->data()); });
    if (!got.ok()) Raise(got.status(), f.path);
    fresh->resize(*got);
    buf_ = fresh;  // GIL held again: the buffer and where it starts change together
    buf_at_ = at;
    return fresh;
  }

  std::shared_ptr<Client> client_;
  std::shared_ptr<File> file_;
  const uint64_t blocksize_;
  uint64_t pos_ = 0;
  std::shared_ptr<const std::string> buf_ = std::make_shared<const std::string>();  // [buf_at_, + size) of the file
  uint64_t buf_at_ = 0;
  bool closed_ = false;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Granary's client for the node's worker (granary:// for fsspec); see docs/python.md";

  py::class_<File, std::shared_ptr<File>>(m, "File")
      .def_property_readonly("size", &File::size)
      .def_property_readonly("path", [](const File& f) { return f.path; })
      .def_property_readonly("version", [](const File& f) { return f.info.version(); })
      .def_property_readonly("ino", [](const File& f) { return f.info.attr().ino(); });

  py::class_<PyFile>(m, "Reader")
      .def("read", &PyFile::Read, py::arg("size") = -1)
      .def("read1", &PyFile::Read, py::arg("size") = -1)
      .def("readall", [](PyFile& f) { return f.Read(-1); })
      .def("readinto", &PyFile::ReadInto)
      .def("readinto1", &PyFile::ReadInto)
      .def("readline", &PyFile::ReadLine, py::arg("size") = -1)
      .def("seek", &PyFile::Seek, py::arg("offset"), py::arg("whence") = 0)
      .def("tell", &PyFile::Tell)
      .def("close", &PyFile::Close)
      .def("flush", [](PyFile&) {})
      .def("readable", [](PyFile&) { return true; })
      .def("seekable", [](PyFile&) { return true; })
      .def("writable", [](PyFile&) { return false; })
      .def("isatty", [](PyFile&) { return false; })
      .def("fileno", [](PyFile& f) -> int {
        py::object unsupported = py::module_::import("io").attr("UnsupportedOperation");
        PyErr_SetString(unsupported.ptr(), ("granary://" + f.file().path + " has no file descriptor").c_str());
        throw py::error_already_set();
      })
      .def_property_readonly("closed", &PyFile::closed)
      .def_property_readonly("name", [](const PyFile& f) { return "granary://" + f.file().path; })
      .def_property_readonly("path", [](const PyFile& f) { return f.file().path; })
      .def_property_readonly("mode", [](const PyFile&) { return "rb"; })
      .def_property_readonly("size", [](const PyFile& f) { return f.file().size(); })
      .def_property_readonly("version", [](const PyFile& f) { return f.file().info.version(); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyFile& f, py::args) { f.Close(); return false; })
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](PyFile& f) {
        py::bytes line = f.ReadLine(-1);
        if (PyBytes_GET_SIZE(line.ptr()) == 0) throw py::stop_iteration();
        return line;
      })
      .def("__repr__", [](const PyFile& f) { return "<granary.Reader granary://" + f.file().path + ">"; });

  py::class_<Client, std::shared_ptr<Client>>(m, "Client")
      // True in a process forked after the client was made: make a new one there (no system call).
      .def("forked", &Client::Forked)
      .def(py::init([](const std::string& socket, double metadata_ttl, double worker_wait, size_t max_entries) {
             ClientOptions o;
             o.socket = socket;
             o.metadata_ttl = std::chrono::milliseconds(static_cast<int64_t>(metadata_ttl * 1000));
             o.worker_wait = std::chrono::milliseconds(static_cast<int64_t>(worker_wait * 1000));
             o.max_entries = max_entries;
             auto c = Unlocked([&] { return Client::Create(o); });
             if (!c.ok()) Raise(c.status(), socket);
             return *c;
           }),
           py::arg("socket"), py::arg("metadata_ttl") = 60.0, py::arg("worker_wait") = 60.0,
           py::arg("max_entries") = 262144)
      .def("stat",
           [](Client& c, const std::string& path) {
             auto e = Unlocked([&] { return c.Stat(path); });
             if (!e.ok()) Raise(e.status(), path);
             return Info(Client::Clean(path), *e);
           })
      .def("ls",
           [](Client& c, const std::string& path) {
             auto l = Unlocked([&] { return c.List(path); });
             if (!l.ok()) Raise(l.status(), path);
             const std::string base = Client::Clean(path);
             py::list out;
             for (const auto& [name, e] : *l) out.append(Info(base == "/" ? "/" + name : base + "/" + name, e));
             return out;
           })
      .def("open",
           [](Client& c, const std::string& path) {
             auto f = Unlocked([&] { return c.Open(path); });
             if (!f.ok()) Raise(f.status(), path);
             return *f;
           })
      .def(
          "reader",
          [](std::shared_ptr<Client> c, const std::string& path, uint64_t blocksize) {
            auto f = OpenFile(*c, path);
            if (!f.ok()) Raise(f.status(), path);
            return std::make_unique<PyFile>(c, *f, blocksize);
          },
          py::arg("path"), py::arg("blocksize") = 0)
      .def("pread",
           [](Client& c, File& f, uint64_t offset, int64_t length) { return ReadBytes(c, f, offset, length); },
           py::arg("file"), py::arg("offset"), py::arg("length") = -1)
      .def("readinto",
           [](Client& c, File& f, uint64_t offset, py::object buffer) {
             Py_buffer view;
             if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
               throw py::error_already_set();
             }
             const uint64_t room = static_cast<uint64_t>(view.len);
             auto got = Unlocked([&] { return c.Read(f, offset, room, static_cast<char*>(view.buf)); });
             PyBuffer_Release(&view);
             if (!got.ok()) Raise(got.status(), f.path);
             return *got;
           })
      // One call for a whole read: open (from the cache, as a rule) and read, without the GIL.
      .def(
          "cat",
          [](Client& c, const std::string& path, uint64_t start, int64_t end) {
            auto f = OpenFile(c, path);
            if (!f.ok()) Raise(f.status(), path);
            const int64_t length = end < 0 ? -1 : (end > static_cast<int64_t>(start) ? end - static_cast<int64_t>(start) : 0);
            return ReadBytes(c, **f, start, length);
          },
          py::arg("path"), py::arg("start") = 0, py::arg("end") = -1);

  // For the security tests (tests/python/fsspec_check.py): requests a careless or hostile process
  // could send on the socket itself, answered with the worker's status code's name ("OK",
  // "UNAUTHENTICATED", ...). Nothing here can do more than a process writing to the socket.
  py::module_ t = m.def_submodule("testing", "raw requests on the worker's socket, for security tests");
  t.def("read_as", [](Client& c, const std::string& socket, const std::string& identity_path,
                      const std::string& grant_path, const std::string& ufs_path) {
    return Unlocked([&]() -> std::string {
      // A read naming identity_path's file (or `ufs_path` in its mount, when given) with the data
      // grant of grant_path's (none when empty).
      auto id = c.Stat(identity_path);
      if (!id.ok() || id->file == nullptr) return "no identity: " + id.status().ToString();
      std::string grant;
      if (!grant_path.empty()) {
        auto g = c.Stat(grant_path);
        if (!g.ok()) return "no grant: " + g.status().ToString();
        grant = g->data_grant;
      }
      granary::rpc::ReadBlockRequest req;
      req.set_mount_id(id->file->mount_id());
      req.set_ufs_path(ufs_path.empty() ? id->file->ufs_path() : ufs_path);
      req.set_version(id->file->version());
      req.set_file_size(id->file->attr().size());
      req.set_block_size(id->file->block_size());
      req.set_length(std::min<uint64_t>(id->file->attr().size(), 4096));
      granary::fuse::LocalChannel ch(socket);
      granary::fuse::LocalChannel::Piece p;
      Status st = ch.Read(req, &p, /*want_source=*/true, nullptr, nullptr, grant);
      ch.Release(&p);
      return std::string(granary::CodeName(st.code()));
    });
  });
  t.def("lookup_as", [](const std::string& socket, uint64_t ino, const py::bytes& grant, const std::string& name) {
    std::string g = grant;
    return Unlocked([&]() -> std::string {
      granary::rpc::MetaCall call;
      call.set_op(name.empty() ? granary::rpc::MetaCall::READDIR : granary::rpc::MetaCall::LOOKUP);
      call.set_ino(ino);
      call.set_grant(g);
      call.set_name(name);
      granary::rpc::MetaAnswer a;
      granary::fuse::LocalChannel ch(socket);
      return std::string(granary::CodeName(ch.Meta(call, &a).code()));
    });
  });
  t.def("grant_of", [](Client& c, const std::string& path) {
    auto e = Unlocked([&] { return c.Stat(path); });
    if (!e.ok()) Raise(e.status(), path);
    return py::bytes(e->grant);
  });
  t.def("pipe_as", [](const std::string& socket) {
    // A stream_pipe request (LocalRequest.stream_pipe) with a pipe's write end attached.
    return Unlocked([&]() -> std::string {
      auto conn = granary::ConnectUnix(socket);
      if (!conn.ok()) return std::string(granary::CodeName(conn.status().code()));
      int p[2];
      if (pipe(p) != 0) {
        close(*conn);
        return "no pipe";
      }
      granary::rpc::LocalRequest lr;
      lr.set_stream_pipe(true);
      granary::rpc::LocalResponse resp;
      int fd = -1;
      Status st = granary::SendFrame(*conn, lr, p[1]);
      if (st.ok()) st = granary::RecvFrame(*conn, &resp, &fd);
      if (fd >= 0) close(fd);
      close(p[0]);
      close(p[1]);
      close(*conn);
      if (!st.ok()) return "broken: " + st.ToString();
      return std::string(granary::CodeName(static_cast<Code>(resp.code())));
    });
  });
  t.def("write_as", [](const std::string& socket) {
    return Unlocked([&]() -> std::string {
      int fd = -1;
      auto conn = granary::ConnectUnix(socket);
      if (!conn.ok()) return std::string(granary::CodeName(conn.status().code()));
      granary::rpc::LocalRequest lr;
      lr.mutable_write()->set_op(granary::rpc::WriteCall::BEGIN);
      granary::rpc::LocalResponse resp;
      Status st = granary::SendFrame(*conn, lr);
      if (st.ok()) st = granary::RecvFrame(*conn, &resp, &fd);
      if (fd >= 0) close(fd);
      close(*conn);
      if (!st.ok()) return "broken: " + st.ToString();
      return std::string(granary::CodeName(static_cast<Code>(resp.code())));
    });
  });
}
