// CPU twin of the tiling header a CANN build generates (kernel_tiling/kernel_tiling.h): the
// Matmul API's TCubeTiling, every field an int32_t, in the order of the API's definition
// (asc-devkit include/adv_api/matmul/matmul_tilingdata.h), in namespace AscendC::tiling and
// exported to the global namespace as the generated header does for its legacy structs.
// Generated kernels fill the fields by name, so the order only matters to a kernel that copies
// the struct whole (ours do not).
#ifndef TF_AUTOFUSE_TWIN_KERNEL_TILING_H_
#define TF_AUTOFUSE_TWIN_KERNEL_TILING_H_

#include <cstdint>

namespace AscendC {
namespace tiling {
struct TCubeTiling {
  int32_t usedCoreNum = 0;
  int32_t M = 0, N = 0, Ka = 0, Kb = 0;
  int32_t singleCoreM = 0, singleCoreN = 0, singleCoreK = 0;
  int32_t baseM = 0, baseN = 0, baseK = 0;
  int32_t depthA1 = 0, depthB1 = 0;
  int32_t stepM = 0, stepN = 0;
  int32_t isBias = 0;
  int32_t transLength = 0;
  int32_t iterateOrder = 0;
  int32_t shareMode = 0, shareL1Size = 0, shareL0CSize = 0, shareUbSize = 0;
  int32_t batchM = 0, batchN = 0, singleBatchM = 0, singleBatchN = 0;
  int32_t stepKa = 0, stepKb = 0;
  int32_t depthAL1CacheUB = 0, depthBL1CacheUB = 0;
  int32_t dbL0A = 0, dbL0B = 0, dbL0C = 0;
  int32_t ALayoutInfoB = 0, ALayoutInfoS = 0, ALayoutInfoN = 0, ALayoutInfoG = 0, ALayoutInfoD = 0;
  int32_t BLayoutInfoB = 0, BLayoutInfoS = 0, BLayoutInfoN = 0, BLayoutInfoG = 0, BLayoutInfoD = 0;
  int32_t CLayoutInfoB = 0, CLayoutInfoS1 = 0, CLayoutInfoN = 0, CLayoutInfoG = 0, CLayoutInfoS2 = 0;
  int32_t BatchNum = 0;
  int32_t mxTypePara = 0;
};
}  // namespace tiling
}  // namespace AscendC
using AscendC::tiling::TCubeTiling;

#endif  // TF_AUTOFUSE_TWIN_KERNEL_TILING_H_
