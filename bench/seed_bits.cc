// LD_PRELOAD shim: std::random_device yields only SEED_BITS random bits (default 32), so
// TensorFlow's per-thread request-id seeds collide within seconds (bench/rungraph_id_collision.py).
//   g++ -O2 -shared -fPIC -o /tmp/libseed_bits.so bench/seed_bits.cc
//   SEED_BITS=14 LD_PRELOAD=/tmp/libseed_bits.so python -m examples.train ...
#include <random>
#include <cstdlib>
#include <sys/random.h>
namespace std {
unsigned int random_device::_M_getval() {
  static const int bits = [] {
    const char* v = getenv("SEED_BITS");
    int b = v ? atoi(v) : 32;
    return (b < 1 || b > 32) ? 32 : b;
  }();
  unsigned int value = 0;
  while (getrandom(&value, sizeof(value), 0) != sizeof(value)) {}
  return bits == 32 ? value : (value & ((1u << bits) - 1));
}
}  // namespace std
