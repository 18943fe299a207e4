// The master's on-disk records (proto/meta.proto) against the wire messages: every field converts
// both ways (a field added to one side and forgotten in master/records.cc fails here), and the
// encodings are frozen by golden bytes (a change to the on-disk schema fails here too).
#include "master/records.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace granary::master {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Sets every field of `m` (recursively, one element per repeated field) to a value derived from
// `seed` and the field number, so no field is left at its default.
void FillAll(Message* m, int seed) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    int v = seed * 100 + f->number();
    if (f->is_map()) {
      Message* entry = r->AddMessage(m, f);
      FillAll(entry, seed + 1);
      continue;
    }
    if (f->is_repeated()) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, "s" + std::to_string(v)); break;
        case FieldDescriptor::CPPTYPE_MESSAGE: FillAll(r->AddMessage(m, f), seed + 1); break;
        default: FAIL() << "unhandled repeated field " << f->full_name();
      }
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, v); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, v); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, v); break;
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, 3); break;  // also a valid JobState
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, "s" + std::to_string(v)); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(m, f, 3); break;
      case FieldDescriptor::CPPTYPE_MESSAGE: FillAll(r->MutableMessage(m, f), seed + 1); break;
      default: FAIL() << "unhandled field " << f->full_name();
    }
  }
}

// `transient`: wire fields the master computes when it answers and never keeps (LoadJob's
// waiting_behind and jobs_ahead: where a pending job stands in its queue now). Every other field
// must convert.
template <typename Wire>
void ExpectRoundTrip(const std::set<std::string>& transient = {}) {
  Wire w;
  FillAll(&w, 1);
  for (const std::string& name : transient) {
    const FieldDescriptor* f = Wire::descriptor()->FindFieldByName(name);
    ASSERT_NE(f, nullptr) << "no field " << name;
    w.GetReflection()->ClearField(&w, f);
  }
  Wire back = FromRecord(ToRecord(w));
  std::string diff;
  google::protobuf::util::MessageDifferencer md;
  md.ReportDifferencesToString(&diff);
  EXPECT_TRUE(md.Compare(w, back)) << Wire::descriptor()->full_name() << " lost fields:\n" << diff;
  // And the record side: every field it has is carried by the wire message.
  EXPECT_EQ(ToRecord(w).GetDescriptor()->field_count() + static_cast<int>(transient.size()),
            Wire::descriptor()->field_count())
      << "the record and the wire message have different fields; convert the new one in master/records.cc";
}

TEST(Records, EveryFieldConvertsBothWays) {
  ExpectRoundTrip<rpc::MountInfo>();
  ExpectRoundTrip<rpc::LoadJobSpec>();
  ExpectRoundTrip<rpc::LoadJob>({"waiting_behind", "jobs_ahead"});
}

std::string Hex(const std::string& bytes) {
  static const char* k = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += k[c >> 4];
    out += k[c & 15];
  }
  return out;
}

TEST(Records, OnDiskEncodingsAreFrozen) {
  MountRecord m;
  m.set_id(7);
  m.set_path("/imagenet");
  m.set_uri("s3://bkt/train");
  (*m.mutable_options())["cache.replicas"] = "2";
  m.set_root_ino(42);
  m.set_created_ns(1700000000000000000);
  m.set_known_files(3);
  m.set_known_bytes(330000);
  EXPECT_EQ(Hex(m.SerializeAsString()),
            "0807"                                  // id 7
            "12092f696d6167656e6574"                // path
            "1a0e73333a2f2f626b742f747261696e"      // uri
            "22130a0e63616368652e7265706c696361731201" "32"  // options {cache.replicas: 2}
            "282a"                                  // root_ino 42
            "308080a8b1e39fe7cb17"                  // created_ns
            "3803"                                  // known_files 3
            "40909214")                             // known_bytes 330000
      << "MountRecord's encoding changed: that breaks every master's database";
  // A record written before the split (a MountInfo) still reads.
  rpc::MountInfo old = FromRecord(m);
  MountRecord reread;
  ASSERT_TRUE(reread.ParseFromString(old.SerializeAsString()));
  EXPECT_EQ(reread.SerializeAsString(), m.SerializeAsString());

  LoadJobRecord j;
  j.set_id(9);
  j.mutable_spec()->add_paths("/imagenet/train");
  j.set_state(2);
  j.set_files_done(5);
  j.set_resumed(1);
  EXPECT_EQ(Hex(j.SerializeAsString()), "080912110a0f2f696d6167656e65742f747261696e1802380598" "0101")
      << "LoadJobRecord's encoding changed";
}

}  // namespace
}  // namespace granary::master
