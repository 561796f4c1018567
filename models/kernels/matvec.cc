// Matrix-vector products for decoding (a few rows times a weight matrix), called from XLA:CPU programs as custom
// calls (models/kernels/native.py builds, loads and registers this file; models/compiled_decoding.py calls it).
//
// Why: at batch 1 a token's products read every weight once and do little else, so their time is the weights'
// bytes over the memory bandwidth. XLA:CPU reads bf16 weights no faster than fp32 ones (it widens them first) and
// runs a While body's kernels on one core. Here each product reads the weights as stored (fp32, or bf16 widened in
// registers: half the bytes) on every core the process may use, each summing in fp32.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

struct XlaCustomCallStatus_;

namespace {

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Worker threads that share a product's pieces with the thread XLA called it on. The caller never waits for a
// worker that has not started: it takes pieces until none is left, and a worker that wakes later finds none.
// Workers run at the idle priority (SCHED_IDLE): XLA's own threads, which run the program's other kernels
// across the cores, take a core from a worker the moment they need it. Between products a worker spins for a
// while (a token's products are tens of microseconds apart), then sleeps.
class Pool {
 public:
  static constexpr int kMaxParticipants = 32;
  explicit Pool(int n) : n_(n), pid_(getpid()) {
    for (int i = 1; i < n_; ++i) threads_.emplace_back([this, i] { Work(i); });
  }
  int size() const { return n_; }
  bool owned_by_this_process() const { return pid_ == getpid(); }

  // Runs fn(participant, piece) for every piece in [0, pieces), the caller being participant 0; returns the
  // participants that ran any (bit p). Another call holding the pool: the caller runs every piece.
  uint32_t Run(int64_t pieces, const std::function<void(int, int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || n_ == 1) {
      for (int64_t c = 0; c < pieces; ++c) fn(0, c);
      return 1;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      pieces_ = pieces;
      next_.store(0, std::memory_order_relaxed);
      used_.store(0, std::memory_order_relaxed);
      state_.store(0, std::memory_order_release);  // open, no one in it: workers may join from here on
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    Take(0);
    // No one joins now; wait for those who did, by spinning briefly, then asleep: a worker at idle priority that
    // was preempted inside a piece runs again only on an idle core, and a caller spinning keeps this one busy.
    if ((state_.fetch_or(kClosed, std::memory_order_acq_rel) & ~kClosed) != 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      while ((state_.load(std::memory_order_acquire) & ~kClosed) != 0) {
        if (std::chrono::steady_clock::now() < until) { Relax(); continue; }
        std::unique_lock<std::mutex> lock(mutex_);
        left_.wait(lock, [&] { return (state_.load(std::memory_order_acquire) & ~kClosed) == 0; });
      }
    }
    return used_.load(std::memory_order_acquire) | 1u;
  }

 private:
  static constexpr int64_t kClosed = int64_t(1) << 40;

  void Take(int participant) {
    bool took = false;
    for (;;) {
      const int64_t piece = next_.fetch_add(1, std::memory_order_relaxed);
      if (piece >= pieces_) break;
      (*job_)(participant, piece);
      took = true;
    }
    if (took) used_.fetch_or(1u << participant, std::memory_order_release);
  }

  void Work(int i) {
    struct sched_param idle = {};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
    uint64_t seen = 0;
    for (;;) {
      uint64_t g;
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        if (std::chrono::steady_clock::now() < until) { Relax(); continue; }
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = g;
      int64_t state = state_.load(std::memory_order_acquire);
      while ((state & kClosed) == 0) {  // join the job while it is open
        if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) {
          Take(i);
          if (state_.fetch_sub(1, std::memory_order_acq_rel) == (kClosed | 1)) {  // the last out of a closed job
            std::lock_guard<std::mutex> lock(mutex_);
            left_.notify_all();
          }
          break;
        }
      }
    }
  }

  const int n_;
  const pid_t pid_;
  std::vector<std::thread> threads_;
  std::mutex busy_, mutex_;
  std::condition_variable cv_, left_;  // a job posted; the last worker left a closed job
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> state_{kClosed};  // kClosed, plus the workers inside the job
  std::atomic<int64_t> next_{0};
  std::atomic<uint32_t> used_{0};
  int64_t pieces_ = 0;
  const std::function<void(int, int64_t)>* job_ = nullptr;
};

int CpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n < 1 ? 1 : (n > Pool::kMaxParticipants ? Pool::kMaxParticipants : n);
}

Pool* GetPool() {
  static Pool* pool = nullptr;
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  if (pool == nullptr || !pool->owned_by_this_process()) pool = new Pool(CpuCount());  // a forked child's own
  return pool;
}

inline float Widen(uint16_t h) { uint32_t bits = uint32_t(h) << 16; float f; std::memcpy(&f, &bits, 4); return f; }
inline float Widen(float f) { return f; }

// acc[b, n] += sum_k x[b, k] w[k, n] over rows [k0, k1) of w [k, n] (row-major), every column: whole rows, one
// stream of reads.
template <typename W>
void ProductNN(const float* x, const W* w, float* acc, int64_t B, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    const W* r0 = w + k * N; const W* r1 = r0 + N; const W* r2 = r1 + N; const W* r3 = r2 + N;
    for (int64_t b = 0; b < B; ++b) {
      const float a0 = x[b * K + k], a1 = x[b * K + k + 1], a2 = x[b * K + k + 2], a3 = x[b * K + k + 3];
      float* out = acc + b * N;
      for (int64_t j = 0; j < N; ++j)
        out[j] += a0 * Widen(r0[j]) + a1 * Widen(r1[j]) + a2 * Widen(r2[j]) + a3 * Widen(r3[j]);
    }
  }
  for (; k < k1; ++k) {
    const W* row = w + k * N;
    for (int64_t b = 0; b < B; ++b) {
      const float a = x[b * K + k];
      float* out = acc + b * N;
      for (int64_t j = 0; j < N; ++j) out[j] += a * Widen(row[j]);
    }
  }
}

// y[b, n] = sum_k x[b, k] w[n, k], w [n, k] row-major; rows [n0, n1) of it.
template <typename W>
void ProductNT(const float* x, const W* w, float* y, int64_t B, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const W* row = w + n * K;
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = x + b * K;
      float s[16] = {0};
      int64_t k = 0;
      for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; ++j) s[j] += xb[k + j] * Widen(row[k + j]);
      float t = 0;
      for (; k < K; ++k) t += xb[k] * Widen(row[k]);
      for (int j = 0; j < 16; ++j) t += s[j];
      y[b * N + n] = t;
    }
  }
}

// The opaque string is "rows k n transposed": x [rows, k] fp32, w [k, n] (or [n, k] transposed) in W, y [rows, n].
// w [n, k]: pieces of rows of w, each participant writing its rows of y. w [k, n]: pieces of rows of w, each
// participant summing its pieces into an accumulator of its own ([rows, n]; the caller's is y), added at the end.
template <typename W>
void Product(void* out, const void** in, const char* opaque, size_t opaque_len) {
  long long B, K, N, transposed;
  std::string config(opaque, opaque_len);
  std::sscanf(config.c_str(), "%lld %lld %lld %lld", &B, &K, &N, &transposed);
  const float* x = static_cast<const float*>(in[0]);
  const W* w = static_cast<const W*>(in[1]);
  float* y = static_cast<float*>(out);
  Pool* pool = GetPool();
  if (transposed) {
    const int64_t rows = std::max<int64_t>(16, (N / 64 + 15) / 16 * 16);
    pool->Run((N + rows - 1) / rows, [&](int, int64_t piece) {
      ProductNT(x, w, y, B, K, N, piece * rows, std::min<int64_t>(N, (piece + 1) * rows));
    });
    return;
  }
  const int64_t rows = std::max<int64_t>(4, (K / 16 + 3) / 4 * 4);
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(pool->size()) * B * N);
  float* partial = scratch.data();
  bool started[Pool::kMaxParticipants] = {};
  std::memset(y, 0, sizeof(float) * B * N);
  const uint32_t used = pool->Run((K + rows - 1) / rows, [&](int p, int64_t piece) {
    float* acc = p == 0 ? y : partial + p * B * N;
    if (!started[p]) {
      if (p != 0) std::memset(acc, 0, sizeof(float) * B * N);
      started[p] = true;
    }
    ProductNN(x, w, acc, B, K, N, piece * rows, std::min<int64_t>(K, (piece + 1) * rows));
  });
  for (int p = 1; p < pool->size(); ++p) {
    if ((used >> p & 1u) == 0) continue;
    const float* part = partial + p * B * N;
    for (int64_t j = 0; j < B * N; ++j) y[j] += part[j];
  }
}

}  // namespace

extern "C" void neo_matvec_f32(void* out, const void** in, const char* opaque, size_t len, XlaCustomCallStatus_*) {
  Product<float>(out, in, opaque, len);
}
extern "C" void neo_matvec_bf16(void* out, const void** in, const char* opaque, size_t len, XlaCustomCallStatus_*) {
  Product<uint16_t>(out, in, opaque, len);
}
// Registers both targets with XLA's custom-call registry for the host platform. The registry's two functions come
// from TensorFlow's library as addresses (native.py looks them up), so this file links against nothing of it:
// xla::CustomCallTargetRegistry::Global() and its non-virtual Register(symbol, address, platform), called as a
// function taking the object first (the Itanium C++ ABI of a member function).
extern "C" void neo_register(void* global_address, void* register_address) {
  using Global = void* (*)();
  using Register = void (*)(void*, const std::string&, void*, const std::string&);
  void* registry = reinterpret_cast<Global>(global_address)();
  auto add = reinterpret_cast<Register>(register_address);
  add(registry, "neo_matvec_f32", reinterpret_cast<void*>(&neo_matvec_f32), "Host");
  add(registry, "neo_matvec_bf16", reinterpret_cast<void*>(&neo_matvec_bf16), "Host");
}
