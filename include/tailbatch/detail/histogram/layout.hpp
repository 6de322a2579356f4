// The bucket layout of LatencyHistogram: which bucket a value in nanoseconds falls into,
// and which values a bucket stands for. Machinery; users never name it.
//
// Log-linear (HDR-style) layout with M = 2^bits linear sub-buckets per power of two:
//   - values 0 .. 2M-1 get buckets of width 1 (exact);
//   - above that, the octave [2^k, 2^(k+1)) is cut into M buckets of width 2^(k-bits).
// A bucket's lowest value is therefore at least M times its width, so reporting the
// bucket's midpoint is off by at most 1/(2M) of the true value: 0.78 % for M = 64
// (significant_digits = 2), 0.098 % for M = 512 (significant_digits = 3).
//
// Indices are "absolute" (counted from value 0); a histogram stores only the slots from
// index(lowest) to index(highest), so values below `lowest` cost no memory.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace tailbatch::detail {

class HistogramLayout {
 public:
  // The largest `highest` a layout accepts, in nanoseconds (about 146 years): keeps every
  // index and bucket bound far from overflow.
  static constexpr std::uint64_t max_highest_ns = std::uint64_t{1} << 62;

  // An empty layout (no buckets); only default-constructed snapshots use it.
  constexpr HistogramLayout() noexcept = default;

  // lowest >= 1, highest >= 2 * lowest, highest <= max_highest_ns, 1 <= bits <= 16; the
  // caller (LatencyHistogramConfig validation) checks these.
  constexpr HistogramLayout(std::uint64_t lowest, std::uint64_t highest, int bits) noexcept
      : lowest_(lowest),
        highest_(highest),
        bits_(bits),
        first_(absolute_index(lowest, bits)),
        size_(absolute_index(highest, bits) - absolute_index(lowest, bits) + 1) {}

  // Sub-bucket bits for a number of significant decimal digits: the smallest power of two
  // M with 1/(2M) <= 10^-digits, i.e. M >= 10^digits / 2.
  static constexpr int bits_for_digits(int digits) noexcept {
    std::uint64_t need = 1;
    for (int i = 0; i < digits; ++i) need *= 10;
    need = (need + 1) / 2;
    return static_cast<int>(std::countr_zero(std::bit_ceil(need)));
  }

  static constexpr std::size_t absolute_index(std::uint64_t v, int bits) noexcept {
    // v | 1: the same width for every v >= 1, and no zero test in the generated code.
    const int s = static_cast<int>(std::bit_width(v | 1)) - 1 - bits;
    const int shift = s < 0 ? 0 : s;
    return static_cast<std::size_t>((v >> shift) + (static_cast<std::uint64_t>(shift) << bits));
  }

  // The slot (0 .. size()-1) of a value already clamped to [lowest, highest].
  [[nodiscard]] constexpr std::size_t slot(std::uint64_t v) const noexcept {
    return absolute_index(v, bits_) - first_;
  }

  // The smallest and largest value that fall into a slot (clamped to [lowest, highest]).
  [[nodiscard]] constexpr std::uint64_t slot_low(std::size_t slot) const noexcept {
    const std::uint64_t low = absolute_low(slot + first_);
    return low < lowest_ ? lowest_ : low;
  }
  [[nodiscard]] constexpr std::uint64_t slot_high(std::size_t slot) const noexcept {
    const std::size_t i = slot + first_;
    const std::uint64_t high = absolute_low(i) + width(i) - 1;
    return high > highest_ ? highest_ : high;
  }
  // The value a slot reports: the middle of the values it stands for (rounded down).
  [[nodiscard]] constexpr std::uint64_t slot_mid(std::size_t slot) const noexcept {
    const std::uint64_t low = slot_low(slot);
    return low + (slot_high(slot) - low) / 2;
  }

  // Bucket boundaries: boundary(s) is the lowest value of slot s (1 <= s < size()), so the
  // values below it are exactly those of slots 0 .. s-1. nearest_boundary(v) is the s whose
  // boundary is nearest to v, at most half a bucket (1/(2M) of v) away: 0 when v is at or
  // below the first slot's middle, size() when v lies beyond the last slot's middle.
  [[nodiscard]] constexpr std::uint64_t boundary(std::size_t s) const noexcept {
    return absolute_low(s + first_);
  }
  [[nodiscard]] constexpr std::size_t nearest_boundary(std::uint64_t v) const noexcept {
    if (v <= lowest_) return 0;
    if (v > highest_) return size_;
    const std::size_t s = slot(v);
    const std::uint64_t low = absolute_low(s + first_);
    const std::uint64_t next = low + width(s + first_);
    return v - low <= next - v ? s : s + 1;
  }

  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr std::uint64_t lowest() const noexcept { return lowest_; }
  [[nodiscard]] constexpr std::uint64_t highest() const noexcept { return highest_; }
  [[nodiscard]] constexpr int bits() const noexcept { return bits_; }
  // The worst relative error of a reported value against any value in its bucket.
  [[nodiscard]] constexpr double max_relative_error() const noexcept {
    return 1.0 / static_cast<double>(std::uint64_t{2} << bits_);
  }

 private:
  [[nodiscard]] constexpr int shift_of(std::size_t i) const noexcept {
    const int s = static_cast<int>(i >> bits_) - 1;
    return s < 0 ? 0 : s;
  }
  [[nodiscard]] constexpr std::uint64_t width(std::size_t i) const noexcept {
    return std::uint64_t{1} << shift_of(i);
  }
  [[nodiscard]] constexpr std::uint64_t absolute_low(std::size_t i) const noexcept {
    const int shift = shift_of(i);
    return (static_cast<std::uint64_t>(i) - (static_cast<std::uint64_t>(shift) << bits_)) << shift;
  }

  std::uint64_t lowest_ = 0;
  std::uint64_t highest_ = 0;
  int bits_ = 0;
  std::size_t first_ = 0;
  std::size_t size_ = 0;
};

}  // namespace tailbatch::detail
