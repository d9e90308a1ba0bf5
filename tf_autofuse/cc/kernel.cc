// The AutofuseKernel op: its registration, shape function and CPU kernel.
//
// The node carries a fused program (docs/PROGRAM.md) in its `program` attr. The kernel parses
// and plans it once, at construction, then runs the tiled interpreter (interpreter.cc) over the
// inputs, spreading the tiles over TensorFlow's intra-op thread pool.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "interpreter.h"
#include "program.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tf_autofuse {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::DataTypeVector;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Below this estimated cost (Interpreter::CostPerElement units, roughly cycles) the tiles run
// on the calling thread: waking the pool costs more than it saves. Measured on 2 cores: two
// threads win from ~150 us of single-threaded work (abs on 1M f32, abs->relu->exp on 300K)
// and lose below (abs on 300K, abs->relu->exp on 100K: the wake-up takes ~30-40 us).
constexpr int64_t kInlineCost = 2'000'000;

DataType ToDataType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return tensorflow::DT_HALF;
    case DType::kBF16:
      return tensorflow::DT_BFLOAT16;
    case DType::kF32:
      return tensorflow::DT_FLOAT;
    case DType::kF64:
      return tensorflow::DT_DOUBLE;
    case DType::kI32:
      return tensorflow::DT_INT32;
  }
  return tensorflow::DT_INVALID;
}

// Tin and Tout must be the program's input and output dtypes.
absl::Status CheckSignature(const Program& program, tensorflow::DataTypeSlice tin,
                            tensorflow::DataTypeSlice tout) {
  if (tin.size() != program.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the node has ", tin.size(), " input(s) but the program declares ",
        program.inputs.size()));
  }
  for (size_t j = 0; j < tin.size(); ++j) {
    const DType declared = program.inputs[j].dtype;
    if (tin[j] != ToDataType(declared)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", j, " has dtype ", tensorflow::DataTypeString(tin[j]),
          " but the program declares in", j, ": ", DeclString(program.inputs[j])));
    }
  }
  if (tout.size() != program.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the node has ", tout.size(), " output(s) but the program defines ",
        program.outputs.size()));
  }
  for (size_t k = 0; k < tout.size(); ++k) {
    const DType value = program.OutputDType(static_cast<int>(k));
    if (tout[k] != ToDataType(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output ", k, " has dtype ", tensorflow::DataTypeString(tout[k]), " but out", k,
          " of the program is ", DTypeName(value)));
    }
  }
  return absl::OkStatus();
}

// Parses the program and checks it against the node's types; `who` starts every message.
absl::Status LoadProgram(const std::string& text, tensorflow::DataTypeSlice tin,
                         tensorflow::DataTypeSlice tout, const std::string& who,
                         Program* program) {
  absl::Status status = ParseProgram(text, program);
  if (status.ok()) status = CheckSignature(*program, tin, tout);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat(who, ": ", status.message()));
}

std::string ShapeString(const TensorShape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape.dim_sizes(), ","), "]");
}

// A large output that TensorFlow has just allocated is usually fresh memory from the OS, and
// faulting it in 4 KiB pages costs several times the kernel's own work (measured: a 64 MiB
// f32 output takes 16K page faults per run, and abs->relu->exp on [4096,4096] ran in ~50 ms
// instead of ~16 ms). Advising transparent huge pages before the first write divides the
// faults by 512; numpy does the same for its large arrays. Only the 2 MiB-aligned interior of
// the buffer is advised, so no neighbouring allocation is touched; it is a hint, and an error
// or THP=never changes nothing but the speed.
void AdviseHugePages(char* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  constexpr int64_t kMinBytes = 8 << 20;
  if (bytes < kMinBytes) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

bool MatchesDecl(const TensorShape& shape, const InputDecl& decl) {
  if (decl.unknown_rank) return true;
  if (shape.dims() != static_cast<int>(decl.dims.size())) return false;
  for (int d = 0; d < shape.dims(); ++d) {
    if (decl.dims[d] >= 0 && decl.dims[d] != shape.dim_size(d)) return false;
  }
  return true;
}

absl::Status InferShapes(InferenceContext* c) {
  std::string text;
  DataTypeVector tin, tout;
  TF_RETURN_IF_ERROR(c->GetAttr("program", &text));
  TF_RETURN_IF_ERROR(c->GetAttr("Tin", &tin));
  TF_RETURN_IF_ERROR(c->GetAttr("Tout", &tout));
  Program program;
  TF_RETURN_IF_ERROR(LoadProgram(text, tin, tout, "AutofuseKernel", &program));
  // Elementwise: every input and output has one shape, narrowed by every declaration.
  ShapeHandle merged = c->UnknownShape();
  for (int j = 0; j < c->num_inputs(); ++j) {
    const InputDecl& decl = program.inputs[j];
    ShapeHandle declared = c->UnknownShape();
    if (!decl.unknown_rank) {
      std::vector<DimensionHandle> dims;
      for (int64_t d : decl.dims) dims.push_back(d < 0 ? c->UnknownDim() : c->MakeDim(d));
      declared = c->MakeShape(dims);
    }
    ShapeHandle input;
    absl::Status status = c->Merge(c->input(j), declared, &input);
    if (status.ok()) status = c->Merge(merged, input, &merged);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AutofuseKernel: input ", j, " has shape ", c->DebugString(c->input(j)),
          ", which does not match the program's in", j, ": ", DeclString(decl),
          " or the other inputs (an elementwise program needs one shape): ", status.message()));
    }
  }
  for (int k = 0; k < c->num_outputs(); ++k) c->set_output(k, merged);
  return absl::OkStatus();
}

class AutofuseKernelOp : public OpKernel {
 public:
  explicit AutofuseKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string text;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("program", &text));
    Program program;
    OP_REQUIRES_OK(ctx, LoadProgram(text, ctx->input_types(), ctx->output_types(),
                                    absl::StrCat("AutofuseKernel '", ctx->def().name(), "'"),
                                    &program));
    interpreter_ = std::make_unique<Interpreter>(std::move(program));
  }

  void Compute(OpKernelContext* ctx) override {
    const Program& program = interpreter_->program();
    const TensorShape& shape = ctx->input(0).shape();
    for (int j = 0; j < ctx->num_inputs(); ++j) {
      const TensorShape& input_shape = ctx->input(j).shape();
      OP_REQUIRES(ctx, MatchesDecl(input_shape, program.inputs[j]),
                  absl::InvalidArgumentError(absl::StrCat(
                      "AutofuseKernel '", name(), "': input ", j, " has shape ",
                      ShapeString(input_shape), " but the program declares in", j, ": ",
                      DeclString(program.inputs[j]))));
      OP_REQUIRES(ctx, input_shape == shape,
                  absl::InvalidArgumentError(absl::StrCat(
                      "AutofuseKernel '", name(), "': input ", j, " has shape ",
                      ShapeString(input_shape), " but input 0 has shape ", ShapeString(shape),
                      "; an elementwise program needs equal shapes")));
    }

    IoBuffers io;
    io.inputs.resize(ctx->num_inputs());
    io.outputs.resize(ctx->num_outputs());
    for (int j = 0; j < ctx->num_inputs(); ++j) {
      io.inputs[j] = ctx->input(j).tensor_data().data();
    }
    for (int k = 0; k < ctx->num_outputs(); ++k) {
      Tensor* output = nullptr;
      int forwarded = -1;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              interpreter_->ForwardableInputs(k), k, shape, &output,
                              &forwarded));
      io.outputs[k] = const_cast<char*>(output->tensor_data().data());
      if (forwarded < 0) AdviseHugePages(io.outputs[k], output->TotalBytes());
    }

    const int64_t n = shape.num_elements();
    if (n == 0) return;
    const int64_t num_tiles = interpreter_->NumTiles(n);
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    if (n * interpreter_->CostPerElement() < kInlineCost || num_tiles == 1 ||
        workers == nullptr || workers->NumThreads() <= 1) {
      interpreter_->RunTiles(io, n, 0, num_tiles);
      return;
    }
    workers->ParallelFor(
        num_tiles,
        tensorflow::thread::ThreadPool::SchedulingParams::Adaptive(
            interpreter_->CostPerTile()),
        [&](int64_t first, int64_t last) { interpreter_->RunTiles(io, n, first, last); });
  }

 private:
  std::unique_ptr<Interpreter> interpreter_;
};

}  // namespace

REGISTER_OP("AutofuseKernel")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 1")
    .Attr("Tout: list(type) >= 1")
    .Attr("program: string")
    .SetShapeFn(InferShapes);

REGISTER_KERNEL_BUILDER(Name("AutofuseKernel").Device(tensorflow::DEVICE_CPU), AutofuseKernelOp);

}  // namespace tf_autofuse
