// dataset/tokens' windows over a memory-mapped token file, shared by the plugin's two variants:
// `tokens` itself and `mixture`, whose members are such files (header of this plugin only).
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/run/batch.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/plugin.hpp"
#include "token_file_checks.hpp"

namespace tessera::token_data {

// A read-only mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw tessera::ConfigError("cannot open " + path + ": " + std::strerror(errno), "path");
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      const int err = errno;
      ::close(fd);
      throw tessera::ConfigError("cannot stat " + path + ": " + std::strerror(err), "path");
    }
    size_ = static_cast<std::size_t>(info.st_size);
    if (size_ > 0) {
      void* data = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (data == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw tessera::ConfigError("cannot map " + path + ": " + std::strerror(err), "path");
      }
      data_ = data;
    }
    ::close(fd);  // the mapping stays valid without the descriptor
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const void* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// The order of one epoch: a permutation of [0, n) that depends only on (seed, epoch).
// Fisher-Yates by hand because std::shuffle and std::uniform_int_distribution are
// implementation-defined; mt19937_64 and seed_seq are fully specified, so orders are portable.
inline std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                                      bool shuffle) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  if (!shuffle) return order;
  const auto e = static_cast<std::uint64_t>(epoch);
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(e), static_cast<std::uint32_t>(e >> 32)};
  std::mt19937_64 rng(seq);
  for (std::int64_t i = n - 1; i > 0; --i) {
    // Multiply-shift maps a 64-bit draw onto [0, i] with negligible bias.
    const auto j = static_cast<std::int64_t>(
        (static_cast<unsigned __int128>(rng()) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

struct TokensConfig {
  std::string path;
  std::string dtype = "uint16";
  std::int64_t seq_len = 1;
  std::int64_t stride = 0;  // 0: seq_len
  std::int64_t ignore_token = -1;
  bool shuffle = true;
  std::int64_t seed = -1;  // -1: the run seed
  std::int64_t vocab_size = 0;  // the model's, to check a prepared file's index against (0: no check)
  bool document_mask = false;   // give Batch::document_ids: documents end at eos_id
  std::int64_t eos_id = -1;     // -1: the index's (FILE.json), if any

  static void declare(tessera::ConfigFields<TokensConfig>& f) {
    using C = TokensConfig;
    f.field("path", &C::path, "flat binary file of token ids").required().existing_path();
    // uint8 reads any file as byte-level tokens (a text file is its own token file).
    f.field("dtype", &C::dtype, "width of one token id in the file (uint8: raw bytes)").one_of({"uint8", "uint16", "uint32"});
    f.field("seq_len", &C::seq_len, "tokens per sample (each sample reads seq_len + 1)").required().at_least(1);
    f.field("stride", &C::stride, "tokens between window starts; 0 means seq_len (no overlap)").at_least(0);
    f.field("ignore_token", &C::ignore_token, "token id whose label position takes no loss; -1 = none").at_least(-1);
    f.field("shuffle", &C::shuffle, "a new seeded order every epoch");
    f.field("seed", &C::seed, "seed of the sample order; -1 = the run seed").at_least(-1);
    f.field("vocab_size", &C::vocab_size,
            "the model's vocabulary (e.g. ${components.model.config.vocab_size}): a file whose index "
            "(FILE.json from tessera prepare-data) names a larger tokenizer is refused at validation; 0: no check")
        .at_least(0);
    f.field("document_mask", &C::document_mask,
            "give the model each position's document (a new one after every EOS), so a model that masks "
            "documents attends only within one and restarts positions");
    f.field("eos_id", &C::eos_id, "with document_mask: the id that ends a document (-1: the one in FILE.json)")
        .at_least(-1);
    f.check([](const C& c) {
      check_index(c.path, c.dtype, c.vocab_size);  // first: a dtype mismatch explains a size that does not fit
      check_unindexed_width(c.path, c.dtype, "path");
      check_token_file_size(c.path, c.dtype, c.seq_len, "path");
    });
  }
};

// What a saved position of a token dataset is a position in: the file (its token count and a
// checksum of its first and last 64 KiB, so a file written again is told apart without reading
// all of it) and the windows over it (seq_len, stride, order). Saved with the position; a resume
// from another layout would read other samples than the run has seen, silently.
struct WindowLayout {
  std::int64_t num_tokens = 0, seq_len = 0, stride = 0, shuffle = 0, seed = 0, checksum = 0;

  std::vector<std::int64_t> values() const { return {num_tokens, seq_len, stride, shuffle, seed, checksum}; }
  static constexpr std::int64_t kValues = 6;

  static WindowLayout of(const std::vector<std::int64_t>& v) {
    return {v.at(0), v.at(1), v.at(2), v.at(3), v.at(4), v.at(5)};
  }
  bool operator==(const WindowLayout& o) const { return values() == o.values(); }

  std::string describe() const {
    char checksum_hex[16];
    std::snprintf(checksum_hex, sizeof checksum_hex, "%08x", static_cast<unsigned>(checksum));
    return std::to_string(num_tokens) + " tokens (checksum " + checksum_hex + "), seq_len " + std::to_string(seq_len) +
           ", stride " + std::to_string(stride) + ", " + (shuffle ? "shuffled with seed " + std::to_string(seed) : "in file order");
  }
};

// The checksum of WindowLayout: CRC-32C of the first and the last 64 KiB of the file.
inline std::int64_t edge_checksum(const void* data, std::size_t size) {
  const std::size_t edge = std::min<std::size_t>(size, 64 * 1024);
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint32_t crc = tessera::crc32c(bytes, edge);
  crc = tessera::crc32c(bytes + (size - edge), edge, crc);
  return static_cast<std::int64_t>(crc);
}

// The layout saved in a state under "layout" (a state from before layouts were saved has none:
// accepted as it is); throws naming both layouts when they differ.
inline void check_saved_layout(const tessera::StateDict& state, const WindowLayout& current, const std::string& what) {
  const auto saved = state.find("layout");
  if (saved == state.end()) return;
  const at::Tensor values = saved->second.to(at::kLong).contiguous();
  if (values.dim() != 1 || values.numel() != WindowLayout::kValues) {
    throw tessera::Error(what + " state: the layout holds " + std::to_string(values.numel()) + " values, not " +
                         std::to_string(WindowLayout::kValues));
  }
  const WindowLayout was = WindowLayout::of(
      std::vector<std::int64_t>(values.const_data_ptr<std::int64_t>(), values.const_data_ptr<std::int64_t>() + WindowLayout::kValues));
  if (was == current) return;
  throw tessera::Error(what + " state was saved reading " + was.describe() + "; this run reads " + current.describe() +
                       ". Its position would pick other samples than the run has seen: resume with the file and "
                       "config it was saved with, or start a new run from the checkpoint's weights (an export and "
                       "the model's init_from)");
}

class TokenWindowDataset final : public tessera::Dataset {
 public:
  TokenWindowDataset(const TokensConfig& config, std::uint64_t run_seed)
      : path_(config.path),
        file_(path_),
        token_bytes_(token_bytes(config.dtype)),
        seq_len_(config.seq_len),
        stride_(config.stride == 0 ? seq_len_ : config.stride),
        ignore_token_(config.ignore_token),
        shuffle_(config.shuffle),
        seed_(config.seed < 0 ? run_seed : static_cast<std::uint64_t>(config.seed)) {
    num_tokens_ = checked_token_count(file_.size(), path_, config.dtype, seq_len_, "path");
    num_samples_ = (num_tokens_ - seq_len_ - 1) / stride_ + 1;
    // The seed only when it orders the windows: file order is the same under any seed.
    layout_ = {num_tokens_, seq_len_, stride_, shuffle_ ? 1 : 0, shuffle_ ? static_cast<std::int64_t>(seed_) : 0,
               edge_checksum(file_.data(), file_.size())};
    if (config.document_mask) {
      eos_ = config.eos_id >= 0 ? config.eos_id : read_index(path_).eos_id;
      if (eos_ < 0) {
        throw tessera::ConfigError("document_mask needs the id that ends a document: set eos_id (" + path_ +
                                       " has no index naming one)",
                                   "eos_id");
      }
    }
  }

  void set_shard(std::int64_t rank, std::int64_t world_size) override {
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      throw tessera::Error("dataset/tokens: invalid shard rank " + std::to_string(rank) +
                           " of world size " + std::to_string(world_size));
    }
    rank_ = rank;
    world_size_ = world_size;
  }

  tessera::Batch next_batch(std::int64_t batch_size) override {
    if (batch_size < 1) {
      throw tessera::Error("dataset/tokens: batch size must be >= 1, got " +
                           std::to_string(batch_size));
    }
    at::Tensor input = at::empty({batch_size, seq_len_}, at::kLong);
    at::Tensor labels = at::empty({batch_size, seq_len_}, at::kLong);
    std::int64_t* input_out = input.mutable_data_ptr<std::int64_t>();
    std::int64_t* labels_out = labels.mutable_data_ptr<std::int64_t>();
    at::Tensor documents;
    if (eos_ >= 0) documents = at::empty({batch_size, seq_len_}, at::kLong);
    std::int64_t targets = 0;
    for (std::int64_t b = 0; b < batch_size; ++b) {
      targets += write_draw(cursor_ + rank_, input_out + b * seq_len_, labels_out + b * seq_len_,
                            documents.defined() ? documents.mutable_data_ptr<std::int64_t>() + b * seq_len_ : nullptr);
      cursor_ += world_size_;
    }
    return {std::move(input), std::move(labels), targets, std::move(documents)};
  }

  // Writes draw number `draw` of this file's endless sample sequence (epoch draw / num_samples,
  // in that epoch's order) as seq_len inputs and labels; returns its target count. Draws past an
  // epoch's end continue in the next epoch. dataset/mixture reads its members this way.
  // With `documents_out`, also each position's document: the count of EOS before it.
  std::int64_t write_draw(std::int64_t draw, std::int64_t* input_out, std::int64_t* labels_out,
                          std::int64_t* documents_out = nullptr) {
    const std::int64_t epoch = draw / num_samples_;
    if (epoch != order_epoch_) {
      order_ = epoch_order(num_samples_, seed_, epoch, shuffle_);
      order_epoch_ = epoch;
    }
    const std::int64_t start = order_[static_cast<std::size_t>(draw % num_samples_)] * stride_;
    std::int64_t targets = 0, document = 0;
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      const std::int64_t id = token(start + t);
      *input_out++ = id;
      if (documents_out) {
        *documents_out++ = document;
        document += id == eos_ ? 1 : 0;
      }
      const std::int64_t label = token(start + t + 1);
      const bool ignored = ignore_token_ >= 0 && label == ignore_token_;
      *labels_out++ = ignored ? tessera::kIgnoreIndex : label;
      targets += ignored ? 0 : 1;
    }
    return targets;
  }

  std::int64_t seq_len() const override { return seq_len_; }
  std::int64_t num_samples() const override { return num_samples_; }
  const WindowLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }

  // The cursor is shared by all ranks (rank r reads cursor + r), so any rank's state resumes
  // every rank, and set_shard may come before or after load_state_dict.
  tessera::StateDict state_dict() const override {
    return {{"epoch", at::scalar_tensor(cursor_ / num_samples_, at::kLong)},
            {"position", at::scalar_tensor(cursor_ % num_samples_, at::kLong)},
            {"layout", at::tensor(layout_.values(), at::kLong)}};
  }

  void load_state_dict(const tessera::StateDict& state) override {
    const auto epoch = state.find("epoch");
    const auto position = state.find("position");
    const std::size_t keys = 2 + state.count("layout");
    if (epoch == state.end() || position == state.end() || state.size() != keys) {
      throw tessera::Error("dataset/tokens state: expected exactly the keys epoch, position and layout");
    }
    check_saved_layout(state, layout_, "dataset/tokens (" + path_ + ")");
    const auto e = epoch->second.item<std::int64_t>();
    const auto p = position->second.item<std::int64_t>();
    if (e < 0 || p < 0 || p >= num_samples_) {
      throw tessera::Error("dataset/tokens state: position " + std::to_string(p) +
                           " is outside an epoch of " + std::to_string(num_samples_) +
                           " samples (was the file or seq_len changed?)");
    }
    cursor_ = e * num_samples_ + p;
  }

 private:
  std::int64_t token(std::int64_t i) const {
    if (token_bytes_ == 1) return static_cast<const std::uint8_t*>(file_.data())[i];
    if (token_bytes_ == 2) return static_cast<const std::uint16_t*>(file_.data())[i];
    return static_cast<const std::uint32_t*>(file_.data())[i];
  }

  std::string path_;
  MappedFile file_;
  std::size_t token_bytes_;
  std::int64_t seq_len_;
  std::int64_t stride_;
  std::int64_t ignore_token_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t eos_ = -1;  // with document_mask: the id that ends a document
  std::int64_t num_tokens_ = 0;
  std::int64_t num_samples_ = 0;
  WindowLayout layout_;

  std::int64_t rank_ = 0;
  std::int64_t world_size_ = 1;
  std::int64_t cursor_ = 0;  // global position of rank 0's next sample, across epochs
  std::int64_t order_epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace tessera::token_data
