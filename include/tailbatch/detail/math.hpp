// The few floating-point functions the core uses, without <cmath>.
//
// <cmath> alone preprocesses to about 8 600 lines with libstdc++ 12 (the C99 and special
// functions, their overloads for every arithmetic type), which every file including a core
// header would otherwise pay for a square root and a rounding. Under g++ and clang these are
// the compilers' builtins, which compile to the same instructions or libm calls as the
// <cmath> functions (errno handling included, as the flags decide); elsewhere they forward
// to <cmath>. Only double (and long double for round and llround) is provided: that is all the core
// calls. Call them qualified (detail::sqrt); the classification functions are spelled
// is_finite, is_nan, is_inf so that a C library's isfinite macro cannot reach them.
#pragma once

#if !defined(__GNUC__) && !defined(__clang__)
#include <cmath>
#endif

namespace tailbatch::detail {

#if defined(__GNUC__) || defined(__clang__)

[[nodiscard]] inline double sqrt(double x) noexcept { return __builtin_sqrt(x); }
[[nodiscard]] inline double log(double x) noexcept { return __builtin_log(x); }
[[nodiscard]] inline double pow(double x, double y) noexcept { return __builtin_pow(x, y); }
[[nodiscard]] inline double floor(double x) noexcept { return __builtin_floor(x); }
[[nodiscard]] inline double ceil(double x) noexcept { return __builtin_ceil(x); }
[[nodiscard]] inline double fabs(double x) noexcept { return __builtin_fabs(x); }
[[nodiscard]] inline double round(double x) noexcept { return __builtin_round(x); }
[[nodiscard]] inline long double round(long double x) noexcept { return __builtin_roundl(x); }
[[nodiscard]] inline long long llround(double x) noexcept { return __builtin_llround(x); }
[[nodiscard]] inline long long llround(long double x) noexcept { return __builtin_llroundl(x); }
[[nodiscard]] inline bool is_finite(double x) noexcept { return __builtin_isfinite(x); }
[[nodiscard]] inline bool is_nan(double x) noexcept { return __builtin_isnan(x); }
[[nodiscard]] inline bool is_inf(double x) noexcept { return __builtin_isinf(x); }

#else

[[nodiscard]] inline double sqrt(double x) noexcept { return std::sqrt(x); }
[[nodiscard]] inline double log(double x) noexcept { return std::log(x); }
[[nodiscard]] inline double pow(double x, double y) noexcept { return std::pow(x, y); }
[[nodiscard]] inline double floor(double x) noexcept { return std::floor(x); }
[[nodiscard]] inline double ceil(double x) noexcept { return std::ceil(x); }
[[nodiscard]] inline double fabs(double x) noexcept { return std::fabs(x); }
[[nodiscard]] inline double round(double x) noexcept { return std::round(x); }
[[nodiscard]] inline long double round(long double x) noexcept { return std::round(x); }
[[nodiscard]] inline long long llround(double x) noexcept { return std::llround(x); }
[[nodiscard]] inline long long llround(long double x) noexcept { return std::llround(x); }
[[nodiscard]] inline bool is_finite(double x) noexcept { return std::isfinite(x); }
[[nodiscard]] inline bool is_nan(double x) noexcept { return std::isnan(x); }
[[nodiscard]] inline bool is_inf(double x) noexcept { return std::isinf(x); }

#endif

}  // namespace tailbatch::detail
