// CPU twin of the subset of the Ascend C Matmul high-level API that tf_autofuse's cube kernels
// emit (docs/ASCEND.md, "MatMul epilogues"): `Matmul<MatmulType<...> x4>`, REGIST_MATMUL_OBJ,
// SetTail, SetTensorA/B (with the transpose flags), SetBias, Iterate<true>, GetTensorC<true> into
// a VECIN tensor with sequential write, End; SetSysWorkspace / GetSysWorkSpacePtr.
//
// A kernel runs here on the vector blocks (AIV) only: the cube's work (AIC) is computed inside
// Iterate, in float with the products summed in K order onto the bias (SetBias) or 0. What the
// twin holds the code to, each an error naming the rule (twin::Fail) or, for dtypes, a compile
// error:
//   - the dtype combinations of the Atlas A2 table (A, B, Bias, C; static_assert), C in VECIN as
//     ND, A and B in GM;
//   - the kernel is a mix kernel (KERNEL_TYPE_MIX_AIC_1_2) and has a system workspace of the
//     Atlas A2 size (16 MiB) when the object is registered;
//   - the tiling's consistency (TCubeTiling constraints): baseM, baseN, baseK multiples of 16;
//     baseM * baseK * sizeof(A) * dbL0A within L0A (64 KiB), baseN * baseK * sizeof(B) * dbL0B
//     within L0B (64 KiB), baseM * baseN * 4 * dbL0C within L0C (128 KiB), the bias block within
//     the bias table (1 KiB); depthA1 = stepM * stepKa * (1 or 2), depthB1 = stepN * stepKb * (1
//     or 2); the A and B blocks of L1 within L1 (512 KiB - 128); Ka = Kb = singleCoreK; usedCoreNum
//     within the blocks launched; single-core shapes positive and within the matrix;
//   - REGIST_MATMUL_OBJ expanded in a scope that outlives the object's use (the kernel
//     function): its client goes with that scope;
//   - the call order: SetTensorA/B before Iterate, a transpose only with ISTRANS in the
//     MatmulType, isBias matching SetBias, one GetTensorC after each Iterate (sync mode), nothing
//     after End, and End called before the block ends;
//   - the C tensor of GetTensorC: a freshly allocated VECIN queue tensor, 32-byte aligned, of at
//     least baseM * baseN elements; A and B reads stay inside their GlobalTensors.
// GetTensorC writes the [baseM, baseN] block row by row (row stride baseN, the sequential-write
// layout); the lanes past a tail block's rows and columns are NaN.
#ifndef TF_AUTOFUSE_TWIN_LIB_MATMUL_INTF_H_
#define TF_AUTOFUSE_TWIN_LIB_MATMUL_INTF_H_

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_operator.h"
#include "kernel_tiling/kernel_tiling.h"

enum class CubeFormat { ND = 0, NZ, ND_ALIGN };

namespace twin {
// Atlas A2 (dav-2201) capacities, asc-devkit impl/basic_api/utils/kernel_utils_constants.h
constexpr int64_t kL0ABytes = 64 * 1024;
constexpr int64_t kL0BBytes = 64 * 1024;
constexpr int64_t kL0CBytes = 128 * 1024;
constexpr int64_t kL1Bytes = 512 * 1024 - 128;  // KFC_L1_RESERVER_SIZE kept by the framework
constexpr int64_t kBiasTableBytes = 1024;
constexpr uint64_t kSysWorkspaceBytes = 16ull * 1024 * 1024;  // RESERVED_WORKSPACE for dav-2201

// The Atlas A2 rows of the Matmul API's dtype table (A, B, Bias, C).
template <typename A, typename B, typename Bias, typename C>
constexpr bool CubeAccepts() {
  using F = float;
  using H = half;
  using BF = bfloat16_t;
  if (!std::is_same<A, B>::value) return false;
  if (std::is_same<A, F>::value)
    return (std::is_same<Bias, F>::value || std::is_same<Bias, H>::value) &&
           (std::is_same<C, F>::value || std::is_same<C, H>::value || std::is_same<C, BF>::value);
  if (std::is_same<A, H>::value)
    return (std::is_same<Bias, F>::value || std::is_same<Bias, H>::value) &&
           (std::is_same<C, F>::value || std::is_same<C, H>::value || std::is_same<C, BF>::value);
  if (std::is_same<A, BF>::value)
    return (std::is_same<Bias, F>::value && (std::is_same<C, F>::value || std::is_same<C, BF>::value ||
                                             std::is_same<C, H>::value)) ||
           (std::is_same<Bias, H>::value && (std::is_same<C, F>::value || std::is_same<C, H>::value));
  return false;
}
}  // namespace twin

namespace twin {
// The client REGIST_MATMUL_OBJ declares; the registered object learns when it goes.
struct KfcClient {
  bool* gone = nullptr;
  KfcClient() = default;
  KfcClient(const KfcClient&) = delete;
  ~KfcClient() {
    if (gone) *gone = true;
  }
};
}  // namespace twin

namespace AscendC {

inline void SetSysWorkspace(GM_ADDR workspace) { twin::Cur().sys_workspace = workspace; }
inline GM_ADDR GetSysWorkSpacePtr() { return twin::Cur().sys_workspace; }

template <TPosition POSITION, CubeFormat FORMAT, typename TYPE, bool ISTRANS = false>
struct MatmulType {
  constexpr static TPosition pos = POSITION;
  constexpr static CubeFormat format = FORMAT;
  using T = TYPE;
  constexpr static bool isTrans = ISTRANS;
};

template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE>
class Matmul {
  using SrcA = typename A_TYPE::T;
  using SrcB = typename B_TYPE::T;
  using DstT = typename C_TYPE::T;
  using BiasT = typename BIAS_TYPE::T;
  static_assert(twin::CubeAccepts<SrcA, SrcB, BiasT, DstT>(),
                "Matmul: this A/B/Bias/C dtype combination is not in the Atlas A2 Matmul API's table");
  static_assert(A_TYPE::pos == TPosition::GM && B_TYPE::pos == TPosition::GM && BIAS_TYPE::pos == TPosition::GM,
                "the twin models A, B and Bias in GM");
  static_assert(A_TYPE::format == CubeFormat::ND && B_TYPE::format == CubeFormat::ND,
                "the twin models A and B in ND");
  static_assert(C_TYPE::pos == TPosition::VECIN && C_TYPE::format == CubeFormat::ND,
                "the twin models C written to VECIN as ND (GetTensorC into UB)");

 public:
  Matmul() = default;
  Matmul(const Matmul&) = delete;
  ~Matmul() {
    twin::Block* b = twin::Current();
    if (b && registered_ && !ended_)
      b->errors.push_back("missing End(): a Matmul object was registered and the block ended without End()");
  }

  // REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), obj, &tiling)
  void TwinRegister(TPipe* pipe, GM_ADDR workspace, const TCubeTiling* tiling, twin::KfcClient* client) {
    if (!pipe || !tiling) twin::Fail("REGIST_MATMUL_OBJ: null pipe or tiling");
    client->gone = &clientGone_;
    if (registered_) twin::Fail("REGIST_MATMUL_OBJ: the object is registered twice");
    if (twin::Cur().kernel_type != KERNEL_TYPE_MIX_AIC_1_2)
      twin::Fail("REGIST_MATMUL_OBJ: a Matmul needs the cube: declare the kernel "
                 "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)");
    if (!workspace || !twin::Gm().Contains(workspace, twin::kSysWorkspaceBytes))
      twin::Fail("REGIST_MATMUL_OBJ: no system workspace of " + std::to_string(twin::kSysWorkspaceBytes) +
                 " bytes in GM (SetSysWorkspace with the launch's workspace)");
    t_ = *tiling;
    CheckTiling();
    registered_ = true;
    tailM_ = t_.singleCoreM;
    tailN_ = t_.singleCoreN;
    tailK_ = t_.singleCoreK;
  }

  void SetTail(int tailM = -1, int tailN = -1, int tailK = -1) {
    Ready("SetTail");
    if (iter_) twin::Fail("SetTail after Iterate");
    if (tailM > t_.singleCoreM || tailN > t_.singleCoreN || tailK > t_.singleCoreK || tailM == 0 || tailN == 0 ||
        tailK == 0)
      twin::Fail("SetTail(" + std::to_string(tailM) + ", " + std::to_string(tailN) + ", " + std::to_string(tailK) +
                 "): tails must be positive and within singleCoreM/N/K");
    if (tailM > 0) tailM_ = tailM;
    if (tailN > 0) tailN_ = tailN;
    if (tailK > 0) tailK_ = tailK;
  }
  void SetTensorA(const GlobalTensor<SrcA>& gm, bool isTransposeA = false) {
    Ready("SetTensorA");
    if (isTransposeA && !A_TYPE::isTrans)
      twin::Fail("SetTensorA: isTransposeA needs ISTRANS = true in A's MatmulType");
    a_ = gm;
    transA_ = isTransposeA;
    aSet_ = true;
  }
  void SetTensorB(const GlobalTensor<SrcB>& gm, bool isTransposeB = false) {
    Ready("SetTensorB");
    if (isTransposeB && !B_TYPE::isTrans)
      twin::Fail("SetTensorB: isTransposeB needs ISTRANS = true in B's MatmulType");
    b_ = gm;
    transB_ = isTransposeB;
    bSet_ = true;
  }
  void SetBias(const GlobalTensor<BiasT>& gm) {
    Ready("SetBias");
    bias_ = gm;
    biasSet_ = true;
  }

  template <bool sync = true>
  bool Iterate(bool enPartialSum = false) {
    static_assert(sync, "the twin models the sync mode of Iterate only");
    Ready("Iterate");
    if (enPartialSum) twin::Fail("Iterate: enPartialSum is not modelled by the twin");
    if (!aSet_ || !bSet_) twin::Fail("Iterate before SetTensorA and SetTensorB");
    if ((t_.isBias != 0) != biasSet_)
      twin::Fail(std::string("Iterate: the tiling's isBias is ") + std::to_string(t_.isBias) + " but SetBias was " +
                 (biasSet_ ? "" : "not ") + "called");
    if (pending_)
      twin::Fail("Iterate: the C block of the previous Iterate was not fetched (sync mode: one GetTensorC "
                 "after each Iterate)");
    const int64_t mIters = (tailM_ + t_.baseM - 1) / t_.baseM, nIters = (tailN_ + t_.baseN - 1) / t_.baseN;
    if (iter_ >= mIters * nIters) return false;
    const int64_t mi = t_.iterateOrder == 0 ? iter_ % mIters : iter_ / nIters;
    const int64_t ni = t_.iterateOrder == 0 ? iter_ / mIters : iter_ % nIters;
    const int64_t m0 = mi * t_.baseM, n0 = ni * t_.baseN;
    const int64_t rows = std::min<int64_t>(t_.baseM, tailM_ - m0), cols = std::min<int64_t>(t_.baseN, tailN_ - n0);
    const int64_t K = tailK_;
    // element (m, k) of A and (k, n) of B, relative to the tensors set; the original shapes give
    // the row strides (A [M, Ka] or, transposed, [Ka, M]; B [Kb, N] or, transposed, [N, Kb])
    auto a_index = [&](int64_t m, int64_t k) { return transA_ ? k * t_.M + m : m * t_.Ka + k; };
    auto b_index = [&](int64_t k, int64_t n) { return transB_ ? n * t_.Kb + k : k * t_.N + n; };
    const SrcA* a = a_.Data(static_cast<uint64_t>(
        std::max(a_index(m0 + rows - 1, K - 1), a_index(m0 + rows - 1, 0)) + 1), "Matmul::Iterate (A)");
    const SrcB* b = b_.Data(static_cast<uint64_t>(
        std::max(b_index(K - 1, n0 + cols - 1), b_index(0, n0 + cols - 1)) + 1), "Matmul::Iterate (B)");
    const BiasT* bias = biasSet_ ? bias_.Data(static_cast<uint64_t>(n0 + cols), "Matmul::Iterate (bias)") : nullptr;
    block_.assign(static_cast<size_t>(t_.baseM) * t_.baseN, std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float acc = bias ? static_cast<float>(bias[n0 + c]) : 0.0f;
        for (int64_t k = 0; k < K; ++k)
          acc += static_cast<float>(a[a_index(m0 + r, k)]) * static_cast<float>(b[b_index(k, n0 + c)]);
        block_[r * t_.baseN + c] = acc;
      }
    ++iter_;
    pending_ = true;
    return true;
  }

  template <bool sync = true>
  void GetTensorC(const LocalTensor<DstT>& c, uint8_t enAtomic = 0, bool enSequentialWrite = false) {
    static_assert(sync, "the twin models the sync mode of GetTensorC only");
    Ready("GetTensorC");
    if (!pending_) twin::Fail("GetTensorC without an Iterate before it (one GetTensorC after each Iterate)");
    if (enAtomic) twin::Fail("GetTensorC: enAtomic into UB is not modelled by the twin");
    if (!enSequentialWrite)
      twin::Fail("GetTensorC: the twin models the sequential write into UB (the [baseM, baseN] block) only");
    if (std::strcmp(c.Owner(), "VECIN") != 0)
      twin::Fail(std::string("GetTensorC: C goes to a VECIN queue tensor (C's MatmulType position), not a ") +
                 c.Owner() + " tensor");
    if (!c.GetSlot() || c.GetSlot()->state != twin::Slot::kAllocated)
      twin::Fail("GetTensorC: the C tensor must be freshly allocated (AllocTensor, not yet queued)");
    if (c.UbOffset() % 32)
      twin::Fail("GetTensorC: the C block at UB offset " + std::to_string(c.UbOffset()) + " is not 32-byte aligned");
    const uint32_t count = static_cast<uint32_t>(t_.baseM) * t_.baseN;
    DstT* d = c.Data(count, "GetTensorC (baseM * baseN elements)");
    for (uint32_t i = 0; i < count; ++i) d[i] = static_cast<DstT>(block_[i]);
    pending_ = false;
  }

  void End() {
    Ready("End");
    if (pending_) twin::Fail("End: the C block of the last Iterate was not fetched with GetTensorC");
    ended_ = true;
  }

 private:
  void Ready(const char* api) const {
    if (!registered_) twin::Fail(std::string(api) + " before REGIST_MATMUL_OBJ");
    if (clientGone_)
      twin::Fail(std::string(api) + ": the client REGIST_MATMUL_OBJ declared is gone: expand the macro in "
                 "the kernel function, whose scope outlives the Matmul's use (on the AIC it returns from "
                 "that function)");
    if (ended_) twin::Fail(std::string(api) + " after End()");
  }
  static std::string Str(int64_t v) { return std::to_string(v); }
  void CheckTiling() const {
    const TCubeTiling& t = t_;
    if (t.baseM <= 0 || t.baseN <= 0 || t.baseK <= 0 || t.baseM % 16 || t.baseN % 16 || t.baseK % 16)
      twin::Fail("TCubeTiling: baseM, baseN, baseK (" + Str(t.baseM) + ", " + Str(t.baseN) + ", " + Str(t.baseK) +
                 ") must be positive multiples of 16");
    const int64_t a = sizeof(SrcA), b = sizeof(SrcB);
    if (int64_t(t.baseM) * t.baseK * a * t.dbL0A > twin::kL0ABytes)
      twin::Fail("TCubeTiling: baseM * baseK * sizeof(A) * dbL0A = " + Str(int64_t(t.baseM) * t.baseK * a * t.dbL0A) +
                 " bytes exceeds L0A (" + Str(twin::kL0ABytes) + ")");
    if (int64_t(t.baseN) * t.baseK * b * t.dbL0B > twin::kL0BBytes)
      twin::Fail("TCubeTiling: baseN * baseK * sizeof(B) * dbL0B = " + Str(int64_t(t.baseN) * t.baseK * b * t.dbL0B) +
                 " bytes exceeds L0B (" + Str(twin::kL0BBytes) + ")");
    if (int64_t(t.baseM) * t.baseN * 4 * t.dbL0C > twin::kL0CBytes)
      twin::Fail("TCubeTiling: baseM * baseN * 4 * dbL0C = " + Str(int64_t(t.baseM) * t.baseN * 4 * t.dbL0C) +
                 " bytes exceeds L0C (" + Str(twin::kL0CBytes) + ")");
    if (t.isBias && int64_t(t.baseN) * int64_t(sizeof(BiasT)) > twin::kBiasTableBytes)
      twin::Fail("TCubeTiling: baseN * sizeof(Bias) exceeds the bias table (" + Str(twin::kBiasTableBytes) + ")");
    const bool a1 = t.depthA1 == t.stepM * t.stepKa || t.depthA1 == 2 * t.stepM * t.stepKa;
    const bool b1 = t.depthB1 == t.stepN * t.stepKb || t.depthB1 == 2 * t.stepN * t.stepKb;
    if (t.stepM <= 0 || t.stepKa <= 0 || t.stepN <= 0 || t.stepKb <= 0 || !a1 || !b1)
      twin::Fail("TCubeTiling: depthA1 must be stepM * stepKa * (1 or 2) and depthB1 stepN * stepKb * (1 or 2)");
    const int64_t l1 = int64_t(t.baseM) * t.baseK * t.depthA1 * a + int64_t(t.baseN) * t.baseK * t.depthB1 * b +
                       (t.isBias ? int64_t(t.baseN) * int64_t(sizeof(BiasT)) : 0);
    if (l1 > twin::kL1Bytes)
      twin::Fail("TCubeTiling: the A and B blocks of L1 need " + Str(l1) + " bytes, L1 holds " + Str(twin::kL1Bytes));
    if (t.Ka != t.Kb || t.singleCoreK != t.Ka)
      twin::Fail("TCubeTiling: Ka, Kb and singleCoreK must be equal (K is not split over cores)");
    if (t.M <= 0 || t.N <= 0 || t.Ka <= 0 || t.singleCoreM <= 0 || t.singleCoreN <= 0 || t.singleCoreM > t.M ||
        t.singleCoreN > t.N)
      twin::Fail("TCubeTiling: M, N, K and the single-core shapes must be positive, single-core within the matrix");
    if (t.usedCoreNum <= 0 || t.usedCoreNum > GetBlockNum())
      twin::Fail("TCubeTiling: usedCoreNum " + Str(t.usedCoreNum) + " is not within the " + Str(GetBlockNum()) +
                 " vector blocks launched");
    if (t.iterateOrder != 0 && t.iterateOrder != 1) twin::Fail("TCubeTiling: iterateOrder must be 0 or 1");
    if (t.dbL0A < 1 || t.dbL0A > 2 || t.dbL0B < 1 || t.dbL0B > 2 || t.dbL0C < 1 || t.dbL0C > 2)
      twin::Fail("TCubeTiling: dbL0A, dbL0B, dbL0C must be 1 or 2");
  }

  TCubeTiling t_{};
  bool registered_ = false, ended_ = false, pending_ = false, clientGone_ = false;
  bool aSet_ = false, bSet_ = false, biasSet_ = false, transA_ = false, transB_ = false;
  int64_t tailM_ = 0, tailN_ = 0, tailK_ = 0, iter_ = 0;
  GlobalTensor<SrcA> a_;
  GlobalTensor<SrcB> b_;
  GlobalTensor<BiasT> bias_;
  std::vector<float> block_;
};

// Like the real macro, a client object declared in the scope that expands it: the Matmul works
// while that scope lives (the real macro's AIC side returns from that function after serving
// the cube; its AIV side points the object at this client).
#define REGIST_MATMUL_OBJ(pipe, workspace, obj, tiling) \
  ::twin::KfcClient __kfcClient__;                      \
  (obj).TwinRegister((pipe), (workspace), (tiling), &__kfcClient__)

}  // namespace AscendC

#endif  // TF_AUTOFUSE_TWIN_LIB_MATMUL_INTF_H_
