package cuda

// Prelude starts every generated source. Under NVRTC (__CUDACC__) it defines
// the bit casts, warp shuffles and atomics the kernels use; elsewhere the
// includer must define FERRY_KERNEL, FD, ferry_fbits/ferry_bitsf/
// ferry_dbits/ferry_bitsd, the ferry_shfl_down_* functions, atomicCAS on
// unsigned int and the native atomicAdd forms (the host check in the tests
// does, running blocks' threads as POSIX threads). The half-precision
// conversions are written with integer arithmetic only, so they are exact and
// identical on both sides: round to nearest even from the exact double value,
// overflow to infinity, NaN to the canonical quiet NaN. Under NVRTC the FD
// functions are inline but not static: a kernel uses few of them, and NVRTC
// warns about every unused static function (#177-D).
const Prelude = `// Ferry generated CUDA C
#ifdef __CUDACC__
#define FERRY_KERNEL extern "C" __global__ void
#define FD __device__ __forceinline__
FD unsigned int ferry_fbits(float x) { return __float_as_uint(x); }
FD float ferry_bitsf(unsigned int b) { return __uint_as_float(b); }
FD unsigned long long ferry_dbits(double x) { return (unsigned long long)__double_as_longlong(x); }
FD double ferry_bitsd(unsigned long long b) { return __longlong_as_double((long long)b); }
FD float ferry_shfl_down_f32(float v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
FD double ferry_shfl_down_f64(double v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
FD int ferry_shfl_down_i32(int v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
FD unsigned int ferry_shfl_down_u32(unsigned int v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
FD long long ferry_shfl_down_i64(long long v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
FD unsigned long long ferry_shfl_down_u64(unsigned long long v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
#endif
FD unsigned short ferry_d2small(double x, int ebits, int mbits) {
  unsigned long long b = ferry_dbits(x);
  unsigned short sign = (unsigned short)((b >> 48) & 0x8000u);
  b &= 0x7fffffffffffffffULL;
  int bias = (1 << (ebits - 1)) - 1;
  unsigned short inf = (unsigned short)(((1u << ebits) - 1u) << mbits);
  if (b >= 0x7ff0000000000000ULL) return b > 0x7ff0000000000000ULL ? (unsigned short)(inf | (1u << (mbits - 1))) : (unsigned short)(sign | inf);
  int e = (int)(b >> 52) - 1023;
  if (e > bias) return (unsigned short)(sign | inf);
  if ((b >> 52) == 0) return sign; /* double subnormal: far below the smallest subnormal */
  unsigned long long m = (b & 0xfffffffffffffULL) | (1ULL << 52);
  int emin = 1 - bias;
  int q = e >= emin ? e - mbits : emin - mbits; /* exponent of the unit in the last place */
  int shift = 52 + q - e;
  if (shift >= 54) return sign;
  unsigned long long r = m >> shift, rem = m & ((1ULL << shift) - 1ULL), half = 1ULL << (shift - 1);
  if (rem > half || (rem == half && (r & 1ULL))) r++;
  if (e >= emin) return (unsigned short)(sign | (((unsigned long long)(e + bias) << mbits) + (r - (1ULL << mbits))));
  return (unsigned short)(sign | r);
}
FD unsigned short ferry_d2h(double x) { return ferry_d2small(x, 5, 10); }
FD unsigned short ferry_d2b(double x) { return ferry_d2small(x, 8, 7); }
FD unsigned short ferry_f2h(float x) { return ferry_d2h((double)x); }
FD unsigned short ferry_f2b(float x) { return ferry_d2b((double)x); }
FD float ferry_b2f(unsigned short h) { return ferry_bitsf((unsigned int)h << 16); }
FD float ferry_h2f(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return ferry_bitsf(s | 0x7f800000u | (m << 13));
  if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }
  return ferry_bitsf(s | ((e + 112u) << 23) | (m << 13));
}
FD float ferry_rh(float x) { return ferry_h2f(ferry_f2h(x)); }
FD float ferry_rb(float x) { return ferry_b2f(ferry_f2b(x)); }
/* Atomic adds for the dtypes without a native form: a compare-and-swap loop on
   the aligned 32-bit word holding the element. */
FD void ferry_atomic_add_word(void* p, int bytes, int kind, double v) {
  unsigned long long a = (unsigned long long)p;
  unsigned int* w = (unsigned int*)(a & ~3ULL);
  unsigned int sh = (unsigned int)(a & 3ULL) * 8u, mask = (bytes == 1 ? 0xffu : 0xffffu) << sh;
  unsigned int old = *w, assumed;
  do {
    assumed = old;
    unsigned int x = (assumed & mask) >> sh, y;
    if (kind == 0) y = (x + (unsigned int)(long long)v) & 0xffu;          /* u8: wrap */
    else if (kind == 1) y = (x != 0 || v != 0) ? 1u : 0u;                  /* bool: or */
    else if (kind == 2) y = ferry_f2h(ferry_h2f((unsigned short)x) + (float)v); /* f16 */
    else y = ferry_f2b(ferry_b2f((unsigned short)x) + (float)v);           /* bf16 */
    old = atomicCAS(w, assumed, (assumed & ~mask) | (y << sh));
  } while (assumed != old);
}
`
