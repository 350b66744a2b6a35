// Causal attention of a chunk of new tokens over a KV cache, fused for XLA:CPU (an XLA FFI handler).
// Built and registered by ragen_jax/models/cpu_kernels.py, which documents the operands; the reference semantics are
// transformer.cached_attention's (the XLA path every other backend runs).
//
// Work items are (group of rows, kv head). Flash-style: the cache slots go by tiles of kTile, each tile's keys
// transposed once (16 x 16 blocks by vector shuffles) for all the queries that see it, with a running maximum and
// sum per query (online softmax), so no more than a tile of scores exists at a time. Only real queries
// (t < num_new[b]) and visible slots (0 .. lengths[b] + t) are computed; rows without new tokens cost nothing. The
// slots below `shared`, which every row of a group holds alike, are read once per group for all its rows' queries.
// Written with GCC vector extensions: 16-lane float vectors, one AVX-512 register (two AVX2 ones elsewhere).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float Vec __attribute__((vector_size(64)));
typedef int32_t IVec __attribute__((vector_size(64)));

constexpr int kLanes = 16;
constexpr int kSubTiles = 4;                   // 16-slot blocks per tile
constexpr int kTile = kLanes * kSubTiles;      // cache slots per tile
constexpr float kNoScore = -1e30f;             // the running maximum before any slot, and masked lanes
constexpr IVec kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline Vec Load(const float* p) { Vec x; std::memcpy(&x, p, sizeof x); return x; }
inline void Store(float* p, Vec x) { std::memcpy(p, &x, sizeof x); }
inline Vec Splat(float x) { return Vec{} + x; }
inline Vec Max(Vec a, Vec b) { return a > b ? a : b; }

// Reduces the 16 lanes of x with `op` (halves, quarters, ... folded onto each other); the result is lane 0's.
template <typename Op>
inline float Horizontal(Vec x, Op op) {
  x = op(x, __builtin_shuffle(x, IVec{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
  x = op(x, __builtin_shuffle(x, IVec{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
  x = op(x, __builtin_shuffle(x, IVec{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
  x = op(x, __builtin_shuffle(x, IVec{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
  return x[0];
}

inline float HorizontalMax(Vec x) { return Horizontal(x, [](Vec a, Vec b) { return Max(a, b); }); }
inline float HorizontalSum(Vec x) { return Horizontal(x, [](Vec a, Vec b) { return a + b; }); }

// e^x for x <= 0 (a score minus its running maximum): 2^n e^r with n = round(x / ln 2), ln 2 split in two for the
// reduction, e^r by Cephes expf's polynomial (relative error ~1e-7); x below -87 gives ~1e-38 (callers mask).
inline Vec ExpNonPositive(Vec x) {
  x = Max(x, Splat(-87.0f));
  const IVec n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, IVec);  // truncation: round for x <= 0
  const Vec nf = __builtin_convertvector(n, Vec);
  const Vec r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  Vec poly = Splat(1.9875691500e-4f);
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const IVec bits = (n + 127) << 23;
  Vec scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return poly * scale;
}

// Swaps the off-diagonal h x h blocks of each 2h x 2h block of the 16 x 16 matrix m (rows as vectors); the four
// stages h = 8, 4, 2, 1 transpose it.
template <int h>
inline void TransposeStage(Vec* m, IVec low, IVec high) {
  for (int i = 0; i < kLanes; ++i) {
    if (i & h) continue;
    const Vec a = m[i], b = m[i + h];
    m[i] = __builtin_shuffle(a, b, low);
    m[i + h] = __builtin_shuffle(a, b, high);
  }
}

inline void Transpose16(Vec* m) {
  TransposeStage<8>(m, IVec{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                    IVec{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  TransposeStage<4>(m, IVec{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                    IVec{4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31});
  TransposeStage<2>(m, IVec{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                    IVec{2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31});
  TransposeStage<1>(m, IVec{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
                    IVec{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31});
}

struct Problem {
  const float* q;  // [B, T, H, hd]
  const float* k;  // this layer's keys [B, K, S, hd]
  const float* v;  // this layer's values [B, K, S, hd]
  const int32_t* lengths;  // [B]
  const int32_t* num_new;  // [B]
  float* out;  // [B, T, H * hd]
  int64_t B, T, H, K, S, shared, group_size;
};

// One kv head of one group of rows: the state of each of its queries and the current tile.
template <int HD>
class GroupHead {
 public:
  static constexpr int kChunks = HD / kLanes;  // vectors per key or value

  GroupHead(const Problem& p, int64_t group, int64_t kh) : p_(p), kh_(kh), G_(p.H / p.K) {
    const int64_t first_row = group * p.group_size;
    for (int64_t r = first_row; r < first_row + p.group_size; ++r) {
      const int64_t n = std::min<int64_t>(p.num_new[r], p.T);
      rows_.push_back({r, static_cast<int64_t>(ends_.size()), n * G_});
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t g = 0; g < G_; ++g) ends_.push_back(std::min<int64_t>(p.lengths[r] + t, p.S - 1));
      }
    }
    const int64_t count = static_cast<int64_t>(ends_.size());
    queries_.resize(count * HD);
    acc_.assign(count * HD, 0.0f);
    top_.assign(count, kNoScore);
    total_.assign(count, 0.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
    for (const Row& row : rows_) {
      for (int64_t i = 0; i < row.queries; ++i) {
        const float* src = p.q + ((row.index * p.T + i / G_) * p.H + kh * G_ + i % G_) * HD;
        for (int d = 0; d < HD; ++d) queries_[(row.first + i) * HD + d] = src[d] * scale;
      }
    }
  }

  void Run() {
    if (ends_.empty()) return;
    const int64_t first_row = rows_.front().index;
    const int64_t shared = std::min<int64_t>(p_.shared, *std::min_element(ends_.begin(), ends_.end()) + 1);
    for (int64_t start = 0; start < shared; start += kTile) {  // the group's shared slots, for all its queries
      LoadTile(first_row, start, std::min<int64_t>(kTile, shared - start));
      for (int64_t i = 0; i < static_cast<int64_t>(ends_.size()); ++i) Attend(i);
    }
    for (const Row& row : rows_) {
      if (row.queries == 0) continue;
      const int64_t last = ends_[row.first + row.queries - 1];
      for (int64_t start = shared; start <= last; start += kTile) {
        LoadTile(row.index, start, std::min<int64_t>(kTile, last - start + 1));
        for (int64_t i = row.first; i < row.first + row.queries; ++i) Attend(i);
      }
      Finish(row);
    }
  }

 private:
  struct Row {
    int64_t index, first, queries;  // the row, its first query's index here, its count of queries (tokens x heads)
  };

  // Slots start .. start + width - 1 of `row`: keys transposed into keys_t_[d][block], value pointers.
  void LoadTile(int64_t row, int64_t start, int64_t width) {
    tile_start_ = start;
    tile_width_ = width;
    const float* keys = p_.k + (row * p_.K + kh_) * p_.S * HD;
    const float* values = p_.v + (row * p_.K + kh_) * p_.S * HD;
    for (int64_t j = 0; j < kTile; ++j) values_[j] = values + (start + std::min(j, width - 1)) * HD;
    for (int block = 0; block < kSubTiles; ++block) {
      for (int c = 0; c < kChunks; ++c) {
        Vec m[kLanes];
        for (int s = 0; s < kLanes; ++s) {
          m[s] = Load(keys + (start + std::min<int64_t>(block * kLanes + s, width - 1)) * HD + c * kLanes);
        }
        Transpose16(m);
        for (int d = 0; d < kLanes; ++d) keys_t_[(c * kLanes + d) * kSubTiles + block] = m[d];
      }
    }
  }

  // Query i over the current tile's slots it sees.
  void Attend(int64_t i) {
    const int64_t count = std::min<int64_t>(tile_width_, ends_[i] - tile_start_ + 1);
    if (count <= 0) return;
    const float* query = &queries_[i * HD];
    Vec scores[kSubTiles] = {};
    for (int d = 0; d < HD; ++d) {
      const float qd = query[d];
      for (int b = 0; b < kSubTiles; ++b) scores[b] += qd * keys_t_[d * kSubTiles + b];
    }
    Vec tile_max = Splat(kNoScore);
    for (int b = 0; b < kSubTiles; ++b) {
      scores[b] = kIota + b * kLanes < static_cast<int32_t>(count) ? scores[b] : Splat(kNoScore);
      tile_max = Max(tile_max, scores[b]);
    }
    const float new_top = std::max(top_[i], HorizontalMax(tile_max));
    const float rescale = std::exp(top_[i] - new_top);
    top_[i] = new_top;
    Vec sum = {};
    alignas(64) float weights[kTile];
    for (int b = 0; b < kSubTiles; ++b) {
      const Vec w = kIota + b * kLanes < static_cast<int32_t>(count) ? ExpNonPositive(scores[b] - new_top) : Vec{};
      sum += w;
      Store(weights + b * kLanes, w);
    }
    total_[i] = total_[i] * rescale + HorizontalSum(sum);
    Vec acc[kChunks];
    for (int c = 0; c < kChunks; ++c) acc[c] = Load(&acc_[i * HD + c * kLanes]) * rescale;
    for (int64_t j = 0; j < count; ++j) {
      const float w = weights[j];
      for (int c = 0; c < kChunks; ++c) acc[c] += w * Load(values_[j] + c * kLanes);
    }
    for (int c = 0; c < kChunks; ++c) Store(&acc_[i * HD + c * kLanes], acc[c]);
  }

  void Finish(const Row& row) {
    for (int64_t i = 0; i < row.queries; ++i) {
      const int64_t q = row.first + i;
      float* dst = p_.out + ((row.index * p_.T + i / G_) * p_.H + kh_ * G_ + i % G_) * HD;
      const float inv = 1.0f / total_[q];
      for (int d = 0; d < HD; ++d) dst[d] = acc_[q * HD + d] * inv;
    }
  }

  const Problem& p_;
  const int64_t kh_, G_;
  std::vector<Row> rows_;
  std::vector<int64_t> ends_;  // per query: its last visible slot
  std::vector<float> queries_, acc_, top_, total_;
  int64_t tile_start_ = 0, tile_width_ = 0;
  Vec keys_t_[HD * kSubTiles];
  const float* values_[kTile];
};

template <int HD>
void Run(const std::vector<Problem>& problems, ffi::ThreadPool& pool) {
  // rows without new tokens, and every row's padding after its new tokens, get zeros
  for (const Problem& p : problems) std::memset(p.out, 0, sizeof(float) * p.B * p.T * p.H * HD);
  struct Progress {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto progress = std::make_shared<Progress>();
  const Problem& first = problems.front();
  const int64_t per_problem = first.B / first.group_size * first.K;  // (group, kv head) of one member
  const int64_t items = per_problem * static_cast<int64_t>(problems.size());
  auto work = [&problems, per_problem, items](Progress& s) {
    for (int64_t i; (i = s.next.fetch_add(1)) < items;) {
      const Problem& p = problems[i / per_problem];
      const int64_t item = i % per_problem;
      GroupHead<HD>(p, item / p.K, item % p.K).Run();
      s.done.fetch_add(1);
    }
  };
  // helpers on XLA's intra-op pool; one that starts after every item is claimed returns at once, touching only
  // `progress` (which it keeps alive)
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), items - 1);
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([progress, work]() { work(*progress); });
  work(*progress);
  while (progress->done.load() < items) std::this_thread::yield();
}

// Operands may carry leading batch dimensions (a vmapped call, `vmap_method="broadcast_all"`: every operand has
// them, all alike): each index of them is one member, an independent problem; all members share the work queue.
ffi::Error CachedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> lengths,
                           ffi::Buffer<ffi::S32> num_new, ffi::Buffer<ffi::S32> shared,
                           ffi::ResultBuffer<ffi::F32> out, int64_t group_size) {
  const auto qd = q.dimensions(), kd = k.dimensions();
  if (qd.size() < 4 || kd.size() != qd.size() + 1)
    return ffi::Error::InvalidArgument("q must be [..., B,T,H,hd], k/v [..., L,B,K,S,hd]");
  const size_t batch_dims = qd.size() - 4;
  int64_t members = 1;
  for (size_t i = 0; i < batch_dims; ++i) {
    if (kd[i] != qd[i]) return ffi::Error::InvalidArgument("cached attention: batch dimensions differ");
    members *= qd[i];
  }
  if (members == 0) return ffi::Error::Success();
  const auto* d = qd.begin() + batch_dims;
  const auto* e = kd.begin() + batch_dims;
  const int64_t B = d[0], T = d[1], H = d[2], hd = d[3], L = e[0], K = e[2], S = e[3];
  if (layer.element_count() != members || shared.element_count() != members ||
      lengths.element_count() != members * B || num_new.element_count() != members * B)
    return ffi::Error::InvalidArgument("cached attention: operands of different batch shapes");
  if (e[1] != B || e[4] != hd || H % K != 0 || group_size < 1 || B % group_size != 0)
    return ffi::Error::InvalidArgument("cached attention: inconsistent shapes or group size");
  const int64_t layer_size = B * K * S * hd, q_size = B * T * H * hd;
  std::vector<Problem> problems(members);
  for (int64_t m = 0; m < members; ++m) {
    const int64_t l = layer.typed_data()[m];
    if (l < 0 || l >= L) return ffi::Error::InvalidArgument("cached attention: layer out of range");
    Problem& p = problems[m];
    p.B = B, p.T = T, p.H = H, p.K = K, p.S = S;
    p.q = q.typed_data() + m * q_size;
    p.k = k.typed_data() + (m * L + l) * layer_size, p.v = v.typed_data() + (m * L + l) * layer_size;
    p.lengths = lengths.typed_data() + m * B, p.num_new = num_new.typed_data() + m * B;
    p.out = out->typed_data() + m * q_size;
    p.shared = group_size > 1 ? shared.typed_data()[m] : 0;
    p.group_size = group_size;
  }
  switch (hd) {
    case 16: Run<16>(problems, pool); break;
    case 32: Run<32>(problems, pool); break;
    case 64: Run<64>(problems, pool); break;
    case 128: Run<128>(problems, pool); break;
    default: return ffi::Error::InvalidArgument("cached attention: head_dim must be 16, 32, 64 or 128");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RagenCachedAttention, CachedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k buffer
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v buffer
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()   // lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // num_new
                                  .Arg<ffi::Buffer<ffi::S32>>()   // shared
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out
                                  .Attr<int64_t>("group_size"));
