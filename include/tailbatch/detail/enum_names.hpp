// Names of enumerators, written once as data. An enum whose values run 0, 1, ..., N-1 in
// declaration order keeps its names (or its fixed messages) in one list in that order,
// and its to_string reads the list here, instead of a switch of N cases per enum.
//
// Bottom layer: includes no tailbatch header. Thread-safe; never allocates; never throws.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

namespace tailbatch::detail {

// names[e], for an enum whose enumerators are 0 .. N-1 in order; `other` for any other
// value (an integer cast to the enum). Count, when given, is how many enumerators the enum
// has: a list of another length does not compile, so adding an enumerator without its
// name fails at compile time, as a switch would warn.
template <std::size_t Count = 0, class Enum, std::size_t N>
requires std::is_enum_v<Enum>
[[nodiscard]] constexpr std::string_view enum_name(Enum e, const std::string_view (&names)[N],
                                                   std::string_view other = "unknown") noexcept {
  static_assert(Count == 0 || Count == N, "enum_name: the list must name every enumerator");
  const auto i = static_cast<std::size_t>(e);
  return i < N ? names[i] : other;
}

}  // namespace tailbatch::detail
