// The reference classifier's weights in a file, mapped read-only as a real server maps its
// checkpoint: pages are read from disk on first touch, not at start-up.
//
//   reference::write_weights_file(reference::Classifier{}, "clf.weights");  // once
//   auto file = std::make_shared<reference::WeightsFile>("clf.weights");     // mmap, no read
//   reference::Classifier clf = reference::load_classifier(file);            // same outputs
//
// POSIX only (open, pread, mmap, mincore, posix_fadvise): on a system without
// <sys/mman.h> this header declares nothing and TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE is 0.
//
// File layout, in this machine's byte order (a file is for the machine that wrote it): a
// 4 096-byte header (WeightsFileHeader: magic, version, dimensions, seed, and the offset and
// length in floats of each array), then embeddings, w1, b1, w2 and b2 in the layouts of
// ClassifierWeights, each starting on a 4 096-byte boundary, so that an array's first page
// holds nothing else.
#pragma once

#if defined(__has_include)
#if __has_include(<sys/mman.h>) && __has_include(<unistd.h>) && __has_include(<fcntl.h>)
#define TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE 1
#endif
#endif
#ifndef TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE
#define TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE 0
#endif

#if TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <tailbatch/detail/throw.hpp>
#include <tailbatch/reference/classifier.hpp>

namespace tailbatch::reference {

// The first bytes of a weights file (the rest of its 4 096-byte header is zero).
struct WeightsFileHeader {
  static constexpr std::array<char, 8> expected_magic = {'T', 'B', 'C', 'L', 'F', 'W', 'T', 'S'};
  static constexpr std::uint32_t current_version = 1;
  static constexpr std::size_t size = 4096;  // bytes reserved for the header; the alignment of every array

  std::array<char, 8> magic = expected_magic;
  std::uint32_t version = current_version;
  std::uint32_t vocab_size = 0;
  std::uint32_t embed_dim = 0;
  std::uint32_t hidden_dim = 0;
  std::uint64_t seed = 0;
  // embeddings, w1, b1, w2, b2: where each array starts (bytes from the start of the file)
  // and how many floats it holds.
  std::array<std::uint64_t, 5> offset{};
  std::array<std::uint64_t, 5> count{};
};

namespace detail {

[[noreturn]] inline void throw_system_error(const std::string& what, int err) {
  tailbatch::detail::throw_or_abort<std::system_error>(what.c_str(), std::error_code(err, std::system_category()), what);
}

// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};

inline void write_all(int fd, const void* data, std::size_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ::ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_system_error("write_weights_file: writing " + path, n < 0 ? errno : EIO);
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

[[nodiscard]] constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t to) noexcept {
  return (n + to - 1) / to * to;
}

[[nodiscard]] inline std::size_t page_size() noexcept {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<std::size_t>(p) : 4096;
}

}  // namespace detail

// Writes model's weights to path (created with mode 0644, or truncated), then
// fdatasync()s it, so that its pages in the page cache are clean and can be dropped
// (WeightsFile::drop_page_cache). Blocks on the disk; allocates. Throws std::system_error
// (with the path) when the file cannot be written. Thread-safe (with respect to model).
inline void write_weights_file(const Classifier& model, const std::string& path) {
  const ClassifierWeights w = model.weights();
  const std::array<std::span<const float>, 5> arrays = {w.embeddings, w.w1, w.b1, w.w2, w.b2};
  WeightsFileHeader header;
  header.vocab_size = w.vocab_size;
  header.embed_dim = w.embed_dim;
  header.hidden_dim = w.hidden_dim;
  header.seed = model.config().seed;
  std::uint64_t at = WeightsFileHeader::size;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    header.offset[i] = at;
    header.count[i] = arrays[i].size();
    at = detail::round_up(at + arrays[i].size_bytes(), WeightsFileHeader::size);
  }

  const detail::FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) detail::throw_system_error("write_weights_file: opening " + path, errno);
  std::vector<unsigned char> first(WeightsFileHeader::size, 0);
  std::memcpy(first.data(), &header, sizeof header);
  detail::write_all(fd.get(), first.data(), first.size(), path);
  std::uint64_t written = WeightsFileHeader::size;
  const std::vector<unsigned char> zeros(WeightsFileHeader::size, 0);
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    detail::write_all(fd.get(), zeros.data(), static_cast<std::size_t>(header.offset[i] - written), path);
    detail::write_all(fd.get(), arrays[i].data(), arrays[i].size_bytes(), path);
    written = header.offset[i] + arrays[i].size_bytes();
  }
  if (::fdatasync(fd.get()) != 0) detail::throw_system_error("write_weights_file: fdatasync " + path, errno);
}

// A weights file mapped read-only (PROT_READ, MAP_PRIVATE). Opening reads the header with
// pread() and maps the file without touching a weight: the pages come in from disk (or
// from the page cache, if they are there) when a forward pass first reads them.
//
// Thread-safety: every member is const and may be called from any number of threads; the
// mapping lives until the object is destroyed (share it with std::shared_ptr, as
// load_classifier does). Neither copyable nor movable. Exceptions: as each member says.
class WeightsFile {
 public:
  // Opens and maps path. Throws std::system_error (with the path) when it cannot be opened
  // or mapped, std::invalid_argument when it is not a weights file of this version or its
  // size does not match its header.
  explicit WeightsFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) detail::throw_system_error("WeightsFile: opening " + path, errno);
    map_checked();
  }

  WeightsFile(const WeightsFile&) = delete;
  WeightsFile& operator=(const WeightsFile&) = delete;
  ~WeightsFile() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }

  // Views of the mapped weights (valid while this object lives). Touches nothing. Thread-safe.
  [[nodiscard]] ClassifierWeights weights() const noexcept {
    return {header_.vocab_size, header_.embed_dim, header_.hidden_dim, array(0), array(1), array(2), array(3), array(4)};
  }

  // The header as read from the file. Thread-safe.
  [[nodiscard]] const WeightsFileHeader& header() const noexcept { return header_; }
  // Bytes mapped (the file's size). Thread-safe.
  [[nodiscard]] std::size_t size_bytes() const noexcept { return bytes_; }
  // The path it was opened with. Thread-safe.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  // The fraction (0 to 1) of the file's pages that are in memory now, from mincore() on the
  // mapping: a page counts if it is in the page cache, whether or not this process has
  // touched it. Allocates one byte per page. Throws std::system_error if mincore fails.
  // Thread-safe.
  [[nodiscard]] double resident_fraction() const {
    const std::size_t page = detail::page_size();
    const std::size_t pages = (bytes_ + page - 1) / page;
    std::vector<unsigned char> in_core(pages, 0);
    if (::mincore(base_, bytes_, in_core.data()) != 0) detail::throw_system_error("WeightsFile: mincore " + path_, errno);
    std::size_t resident = 0;
    for (unsigned char c : in_core) resident += c & 1u;
    return pages == 0 ? 0.0 : static_cast<double>(resident) / static_cast<double>(pages);
  }

  // Asks the kernel to drop the file's pages from the page cache: fdatasync() (so that
  // none is dirty), then posix_fadvise(POSIX_FADV_DONTNEED) over the whole file. Needs no
  // privilege. Advice, not a command: a page that some process has mapped and touched,
  // or that is being written, stays; check with resident_fraction(). Blocks on the disk
  // if pages were dirty. Throws std::system_error if either call fails. Thread-safe.
  void drop_page_cache() const {
    if (::fdatasync(fd_.get()) != 0) detail::throw_system_error("WeightsFile: fdatasync " + path_, errno);
    const int err = ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_DONTNEED);
    if (err != 0) detail::throw_system_error("WeightsFile: posix_fadvise " + path_, err);
  }

 private:
  [[nodiscard]] std::span<const float> array(std::size_t i) const noexcept {
    const auto* first = reinterpret_cast<const float*>(static_cast<const unsigned char*>(base_) + header_.offset[i]);
    return {first, static_cast<std::size_t>(header_.count[i])};
  }

  void map_checked() {
    struct ::stat st {};
    if (::fstat(fd_.get(), &st) != 0) detail::throw_system_error("WeightsFile: fstat " + path_, errno);
    const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
    if (file_bytes < WeightsFileHeader::size) {
      tailbatch::detail::throw_invalid_argument("WeightsFile: " + path_ + " is too short to be a weights file");
    }
    const ::ssize_t n = ::pread(fd_.get(), &header_, sizeof header_, 0);
    if (n != static_cast<::ssize_t>(sizeof header_)) {
      detail::throw_system_error("WeightsFile: reading the header of " + path_, n < 0 ? errno : EIO);
    }
    if (header_.magic != WeightsFileHeader::expected_magic || header_.version != WeightsFileHeader::current_version) {
      tailbatch::detail::throw_invalid_argument("WeightsFile: " + path_ + " is not a version " +
                                                std::to_string(WeightsFileHeader::current_version) + " weights file");
    }
    const std::uint64_t v = header_.vocab_size, e = header_.embed_dim, h = header_.hidden_dim;
    const std::array<std::uint64_t, 5> expected = {v * e, e * h, h, sentiment_count * h, sentiment_count};
    for (std::size_t i = 0; i < expected.size(); ++i) {
      if (header_.count[i] != expected[i] || header_.offset[i] % WeightsFileHeader::size != 0 ||
          header_.offset[i] < WeightsFileHeader::size ||
          header_.offset[i] + header_.count[i] * sizeof(float) > file_bytes) {
        tailbatch::detail::throw_invalid_argument("WeightsFile: " + path_ + ": array " + std::to_string(i) +
                                                  " does not match the header's dimensions or the file's size");
      }
    }
    bytes_ = static_cast<std::size_t>(file_bytes);
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd_.get(), 0);
    if (p == MAP_FAILED) detail::throw_system_error("WeightsFile: mmap " + path_, errno);
    base_ = p;
  }

  std::string path_;
  detail::FileDescriptor fd_;  // closed last, after the mapping
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  WeightsFileHeader header_;
};

// A Classifier whose weights are file's mapping (shared: the mapping lives as long as the
// Classifier or file does). The seed and the dimensions come from the file; config gives
// the rest (max_tokens, long_input, cpu_kernel). Reads no weight. Allocates (the
// tokenizer). Throws std::invalid_argument (a bad config), std::bad_alloc.
[[nodiscard]] inline Classifier load_classifier(std::shared_ptr<const WeightsFile> file, ClassifierConfig config = {}) {
  const WeightsFileHeader& h = file->header();
  config.seed = h.seed;
  config.vocab_size = h.vocab_size;
  config.embed_dim = h.embed_dim;
  config.hidden_dim = h.hidden_dim;
  const ClassifierWeights w = file->weights();
  return Classifier(config, w, std::move(file));
}

// The same, opening and mapping path first. Throws what WeightsFile's constructor throws too.
[[nodiscard]] inline Classifier load_classifier(const std::string& path, ClassifierConfig config = {}) {
  return load_classifier(std::make_shared<const WeightsFile>(path), config);
}

}  // namespace tailbatch::reference

#endif  // TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE
