#include "roll/tracking/tracker.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace {

const std::array<uint32_t, 256>& CrcTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t MaskedCrc(const std::string& data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// --- a minimal protobuf writer for tensorboard's Event message ---
void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void Tag(int field, int wire, std::string* out) { Varint(static_cast<uint64_t>(field << 3 | wire), out); }
void Bytes(int field, const std::string& v, std::string* out) {
  Tag(field, 2, out);
  Varint(v.size(), out);
  out->append(v);
}
template <class T>
void Fixed(int field, T v, std::string* out) {
  Tag(field, sizeof(T) == 8 ? 1 : 5, out);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian host
  out->append(buf, sizeof(T));
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string LittleEndian64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}
std::string LittleEndian32(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}

bool ValidKey(const std::string& k) {
  const size_t slash = k.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < k.size();
}

// --- reader ---
struct Reader {
  const std::string& s;
  size_t pos = 0;
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && pos < s.size(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(s[pos++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool Take(size_t n, std::string* out) {
    if (pos + n > s.size()) return false;
    *out = s.substr(pos, n);
    pos += n;
    return true;
  }
  bool Skip(int wire) {
    uint64_t n = 0;
    std::string tmp;
    switch (wire) {
      case 0: return Varint(&n);
      case 1: return Take(8, &tmp);
      case 2: return Varint(&n) && Take(n, &tmp);
      case 5: return Take(4, &tmp);
      default: return false;
    }
  }
};

bool ParseValue(const std::string& bytes, std::string* tag, float* value, bool* has_value) {
  Reader r{bytes};
  while (r.pos < bytes.size()) {
    uint64_t key = 0;
    if (!r.Varint(&key)) return false;
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    std::string raw;
    if (field == 1 && wire == 2) {
      uint64_t n = 0;
      if (!r.Varint(&n) || !r.Take(n, tag)) return false;
    } else if (field == 2 && wire == 5) {
      if (!r.Take(4, &raw)) return false;
      std::memcpy(value, raw.data(), 4);
      *has_value = true;
    } else if (!r.Skip(wire)) {
      return false;
    }
  }
  return true;
}

bool ParseEvent(const std::string& bytes, std::vector<ScalarEvent>* out) {
  Reader r{bytes};
  double wall = 0;
  int64_t step = 0;
  std::vector<std::pair<std::string, float>> values;
  while (r.pos < bytes.size()) {
    uint64_t key = 0;
    if (!r.Varint(&key)) return false;
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    std::string raw;
    if (field == 1 && wire == 1) {
      if (!r.Take(8, &raw)) return false;
      std::memcpy(&wall, raw.data(), 8);
    } else if (field == 2 && wire == 0) {
      uint64_t v = 0;
      if (!r.Varint(&v)) return false;
      step = static_cast<int64_t>(v);
    } else if (field == 5 && wire == 2) {
      uint64_t n = 0;
      std::string summary;
      if (!r.Varint(&n) || !r.Take(n, &summary)) return false;
      Reader sr{summary};
      while (sr.pos < summary.size()) {
        uint64_t k = 0;
        if (!sr.Varint(&k)) return false;
        if ((k >> 3) == 1 && (k & 7) == 2) {
          uint64_t m = 0;
          std::string value_bytes;
          if (!sr.Varint(&m) || !sr.Take(m, &value_bytes)) return false;
          std::string tag;
          float v = 0;
          bool has = false;
          if (!ParseValue(value_bytes, &tag, &v, &has)) return false;
          if (has) values.emplace_back(tag, v);
        } else if (!sr.Skip(static_cast<int>(k & 7))) {
          return false;
        }
      }
    } else if (!r.Skip(wire)) {
      return false;
    }
  }
  for (auto& [tag, v] : values) out->push_back(ScalarEvent{step, wall, tag, v});
  return true;
}

}  // namespace

uint32_t Crc32c(const std::string& data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = CrcTable()[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

absl::StatusOr<std::unique_ptr<MetricsWriter>> MetricsWriter::Open(const std::string& path,
                                                                   int64_t truncate_after) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (truncate_after >= 0 && std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).at("step").get<int64_t>() > truncate_after) continue;
      } catch (const std::exception&) {
        continue;  // a torn last line from a crash
      }
      kept += line + "\n";
    }
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << kept;
      if (!out) return absl::InternalError(absl::StrCat(tmp, ": cannot write"));
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot replace ", path, ": ", ec.message()));
  }
  std::unique_ptr<MetricsWriter> w(new MetricsWriter(path));
  w->out_.open(path, std::ios::app);
  if (!w->out_) return absl::InternalError(absl::StrCat(path, ": cannot open for writing"));
  return w;
}

absl::Status MetricsWriter::Log(int64_t step, const MetricMap& metrics) {
  nlohmann::json j;
  j["step"] = step;
  for (const auto& [k, v] : metrics) {
    if (!ValidKey(k)) {
      return absl::InvalidArgumentError(absl::StrCat("metric '", k, "' is not named group/name"));
    }
    j[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  }
  out_ << j.dump() << "\n";
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.",
                                        static_cast<int64_t>(WallTime()), ".", host, ".", getpid());
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(path));
  w->out_.open(path, std::ios::binary | std::ios::trunc);
  if (!w->out_) return absl::InternalError(absl::StrCat(path, ": cannot open for writing"));
  std::string ev;
  Fixed<double>(1, WallTime(), &ev);
  Bytes(3, "brain.Event:2", &ev);
  ROLL_RETURN_IF_ERROR(w->WriteRecord(ev));
  return w;
}

absl::Status TensorBoardWriter::WriteRecord(const std::string& data) {
  const std::string len = LittleEndian64(data.size());
  out_ << len << LittleEndian32(MaskedCrc(len)) << data << LittleEndian32(MaskedCrc(data));
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::Log(int64_t step, const MetricMap& metrics) {
  const double now = WallTime();
  for (const auto& [k, v] : metrics) {
    if (!std::isfinite(v)) continue;
    std::string value, summary, ev;
    Bytes(1, k, &value);
    Fixed<float>(2, static_cast<float>(v), &value);
    Bytes(1, value, &summary);
    Fixed<double>(1, now, &ev);
    Tag(2, 0, &ev);
    Varint(static_cast<uint64_t>(step), &ev);
    Bytes(5, summary, &ev);
    ROLL_RETURN_IF_ERROR(WriteRecord(ev));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ScalarEvent>> ReadTensorBoardEvents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::vector<ScalarEvent> out;
  size_t pos = 0;
  while (pos < s.size()) {
    auto bad = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat(path, ": record at byte ", pos, ": ", what));
    };
    if (pos + 12 > s.size()) return bad("truncated header");
    const std::string len_bytes = s.substr(pos, 8);
    uint64_t len = 0;
    uint32_t crc = 0;
    std::memcpy(&len, len_bytes.data(), 8);
    std::memcpy(&crc, s.data() + pos + 8, 4);
    if (crc != MaskedCrc(len_bytes)) return bad("length CRC mismatch");
    if (len > s.size() || pos + 12 + len + 4 > s.size()) return bad("truncated data");
    const std::string data = s.substr(pos + 12, len);
    std::memcpy(&crc, s.data() + pos + 12 + len, 4);
    if (crc != MaskedCrc(data)) return bad("data CRC mismatch");
    if (!ParseEvent(data, &out)) return bad("malformed Event message");
    pos += 12 + len + 4;
  }
  return out;
}

std::string FormatProgressLine(int64_t step, int64_t max_steps, const MetricMap& m,
                               double seconds_per_step) {
  std::string line = absl::StrCat("step ", step, "/", max_steps);
  auto add = [&](const char* key, const char* fmt) {
    auto it = m.find(key);
    if (it != m.end()) absl::StrAppend(&line, " | ", absl::StrFormat(fmt, it->second));
  };
  add("train/reward_mean", "reward %.3f");
  add("train/accuracy", "acc %.3f");
  add("val/accuracy", "val acc %.3f");
  add("throughput/gen_tokens_per_s", "%.0f tok/s");
  if (seconds_per_step > 0) {
    absl::StrAppend(&line, " | ", absl::StrFormat("%.1f s/step", seconds_per_step));
    const int64_t eta = static_cast<int64_t>(seconds_per_step * static_cast<double>(max_steps - step));
    absl::StrAppend(&line, " | ETA ", eta / 60, "m", absl::StrFormat("%02d", eta % 60), "s");
  }
  return line;
}

}  // namespace roll
