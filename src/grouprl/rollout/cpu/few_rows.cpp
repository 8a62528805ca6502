// Few-row matrix products on bf16 copies of fp32 weights, fp32 activations and sums, for x86 CPUs with
// AVX2 and FMA (grouprl.rollout.cpu.bf16_weights says when and why), built by torch.utils.cpp_extension.
//
// y[M, N] = x[M, K] @ W[N, K]^T, with W in panels: W[N/16][K][16] bf16, panel p holding output columns
// 16p .. 16p + 15, so that a product reads each panel front to back, once, converting 16 weights of one
// input position at a time to fp32 (a 16-bit shift) and adding them, times each row's input, into
// 16 sums per row held in registers. Few rows read more weight bytes per multiply than the CPU's caches
// can hide: a panel's next neighbour is prefetched into the L2 cache while it is read, and with 1-3 rows
// several panels go at once, so that enough independent sums are in flight to hide the multiply-add's
// latency. A panel (16 x K x 2 bytes) stays in the L1 or L2 cache while up to 6 rows at a time pass over it.
#include <immintrin.h>
#include <stdint.h>
#include <torch/extension.h>

namespace {

inline __m256 load8(const uint16_t *p) {  // 8 bf16 -> 8 fp32: the bf16 bits are the fp32's upper half
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

// y[MR rows, NP*16 columns] = x[MR, K] @ the NP panels at w (a stride of 16*K apart); ahead: the next panels,
// prefetched meanwhile (null: none)
template <int MR, int NP>
inline void block(const float *x, int64_t K, const uint16_t *w, float *y, int64_t ldy, const uint16_t *ahead) {
    __m256 acc[MR][NP][2];
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += 2) {  // 2 input positions of a panel: one 64-byte cache line
        if (ahead)
            for (int p = 0; p < NP; p++) _mm_prefetch((const char *)(ahead + p * 16 * K + 16 * k0), _MM_HINT_T1);
        for (int64_t k = k0; k < k0 + 2; k++) {
            __m256 w0[NP], w1[NP];
            for (int p = 0; p < NP; p++) {
                w0[p] = load8(w + p * 16 * K + 16 * k);
                w1[p] = load8(w + p * 16 * K + 16 * k + 8);
            }
            for (int r = 0; r < MR; r++) {
                __m256 b = _mm256_broadcast_ss(x + r * K + k);
                for (int p = 0; p < NP; p++) {
                    acc[r][p][0] = _mm256_fmadd_ps(b, w0[p], acc[r][p][0]);
                    acc[r][p][1] = _mm256_fmadd_ps(b, w1[p], acc[r][p][1]);
                }
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) {
            _mm256_storeu_ps(y + r * ldy + 16 * p, acc[r][p][0]);
            _mm256_storeu_ps(y + r * ldy + 16 * p + 8, acc[r][p][1]);
        }
}

// every row over one panel, at most 6 rows at a time (12 sums, 2 weight vectors and a broadcast fill 15 of
// AVX2's 16 registers); only the first pass prefetches
inline void rows_over_panel(const float *x, int64_t M, int64_t K, const uint16_t *w, float *y, int64_t N,
                            const uint16_t *ahead) {
    for (int64_t m = 0; m < M;) {
        int64_t left = M - m, mr = left <= 6 ? left : left <= 8 ? 4 : left <= 10 ? 5 : 6;
        const float *xm = x + m * K;
        float *ym = y + m * N;
        const uint16_t *a = m == 0 ? ahead : nullptr;
        switch (mr) {
            case 6: block<6, 1>(xm, K, w, ym, N, a); break;
            case 5: block<5, 1>(xm, K, w, ym, N, a); break;
            case 4: block<4, 1>(xm, K, w, ym, N, a); break;
            case 3: block<3, 1>(xm, K, w, ym, N, a); break;
            case 2: block<2, 1>(xm, K, w, ym, N, a); break;
            default: block<1, 1>(xm, K, w, ym, N, a);
        }
        m += mr;
    }
}

// 1-3 rows: NP panels at a time; more: one panel at a time, every row over it
template <int NP>
void product(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, float *y, int threads) {
    int64_t panels = N / 16, groups = (panels + NP - 1) / NP;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < groups; g++) {
        int64_t p0 = g * NP;
        const uint16_t *wg = w + p0 * 16 * K;
        const uint16_t *ahead = p0 + 2 * NP <= panels ? wg + NP * 16 * K : nullptr;
        if (p0 + NP > panels) {  // the last, partial group
            for (int64_t p = p0; p < panels; p++) rows_over_panel(x, M, K, w + p * 16 * K, y + 16 * p, N, nullptr);
        } else if (NP == 1) {
            rows_over_panel(x, M, K, wg, y + 16 * p0, N, ahead);
        } else if (M == 1) {
            block<1, NP>(x, K, wg, y + 16 * p0, N, ahead);
        } else if (M == 2) {
            block<2, NP>(x, K, wg, y + 16 * p0, N, ahead);
        } else {
            block<3, NP>(x, K, wg, y + 16 * p0, N, ahead);
        }
    }
}

}  // namespace

// y[M, N] fp32 = x[M, K] fp32 @ W^T, W packed in panels (above) as int16 [N / 16, K, 16] holding the bf16 bits;
// N a multiple of 16, K even. The GIL is released for the call (see the binding below).
torch::Tensor bf16_product(const torch::Tensor &x, const torch::Tensor &panels) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.device().is_cpu(),
                "bf16_product takes x as a contiguous fp32 CPU [rows, in] tensor");
    TORCH_CHECK(panels.dim() == 3 && panels.scalar_type() == torch::kInt16 && panels.is_contiguous() &&
                    panels.size(2) == 16 && panels.size(1) == x.size(1) && x.size(1) % 2 == 0,
                "bf16_product takes contiguous int16 panels [out / 16, in, 16] with in even and equal to x's");
    const int64_t M = x.size(0), K = x.size(1), N = panels.size(0) * 16;
    torch::Tensor y = torch::empty({M, N}, x.options());
    const float *xp = x.data_ptr<float>();
    const uint16_t *w = reinterpret_cast<const uint16_t *>(panels.data_ptr<int16_t>());
    float *yp = y.data_ptr<float>();
    const int threads = at::get_num_threads();
    if (M == 0) return y;
    if (M == 1) product<4>(xp, M, K, w, N, yp, threads);
    else if (M == 2) product<3>(xp, M, K, w, N, yp, threads);
    else if (M == 3) product<2>(xp, M, K, w, N, yp, threads);
    else product<1>(xp, M, K, w, N, yp, threads);
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("bf16_product", &bf16_product, "x [rows, in] fp32 times the packed bf16 weight's transpose",
          pybind11::call_guard<pybind11::gil_scoped_release>());
}
