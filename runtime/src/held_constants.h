/*
 * The address ranges of the constants the runtime holds (the weights modules' tensors), process-wide.
 *
 * A weights module (weights_module.cc) registers its tensors' bytes when it is made and
 * unregisters them when it is destroyed, so a range is listed exactly while its contents and
 * address are fixed. Binding a slot (kernel_recorder.cc) flags it CGRA_SLOT_FLAG_CONSTANT when
 * the tensor lies inside such a range: the device may then load it before the launch starts
 * (cgra_sim/prefetch.py). Header-only: one registry for the library (inline functions' statics).
 */
#ifndef CGRA_RUNTIME_HELD_CONSTANTS_H_
#define CGRA_RUNTIME_HELD_CONSTANTS_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace cgra {

struct HeldConstants {
  std::mutex mutex;
  std::multimap<uintptr_t, uintptr_t> ranges;  // start -> end, one entry per registration
};

inline HeldConstants& HeldConstantRegistry() {
  static HeldConstants registry;
  return registry;
}

inline void RegisterHeldConstant(uintptr_t start, uintptr_t end) {
  HeldConstants& held = HeldConstantRegistry();
  std::lock_guard<std::mutex> lock(held.mutex);
  held.ranges.emplace(start, end);
}

inline void UnregisterHeldConstant(uintptr_t start, uintptr_t end) {
  HeldConstants& held = HeldConstantRegistry();
  std::lock_guard<std::mutex> lock(held.mutex);
  auto [first, last] = held.ranges.equal_range(start);
  for (auto it = first; it != last; ++it) {
    if (it->second == end) {
      held.ranges.erase(it);
      return;
    }
  }
}

/*! \brief Whether [start, end) lies inside one registered range. */
inline bool IsHeldConstant(uintptr_t start, uintptr_t end) {
  HeldConstants& held = HeldConstantRegistry();
  std::lock_guard<std::mutex> lock(held.mutex);
  auto it = held.ranges.upper_bound(start);  // the ranges starting at or before `start` precede it
  while (it != held.ranges.begin()) {
    --it;
    if (it->second >= end) return true;
    if (start - it->first > (uintptr_t{1} << 40)) break;  // no tensor spans a terabyte
  }
  return false;
}

}  // namespace cgra

#endif  // CGRA_RUNTIME_HELD_CONSTANTS_H_
