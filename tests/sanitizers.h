// Whether this build runs under a sanitizer (the asan and tsan presets).
// Tests that repeat work for its own sake (long random sequences, floods)
// do less of it there: the sanitizers check every run of the code the same,
// and the suite stays within its time.
#ifndef SLUICE_TESTS_SANITIZERS_H_
#define SLUICE_TESTS_SANITIZERS_H_

namespace sluice::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_SANITIZERS_H_
