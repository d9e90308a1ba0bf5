// The AutofuseKernel op: its registration, shape function and CPU kernel.
//
// The node carries a fused program (docs/PROGRAM.md) in its `program` attr. The kernel parses
// and plans it once, at construction, then runs the tiled interpreter (interpreter.cc) over the
// inputs, spreading the tiles over TensorFlow's intra-op thread pool.
//
// NPU: when a CANN toolchain is present, the kernel asks the resolver the Python side registered
// (codegen/cann.py, codegen/host/npu_dispatch.h) for the library of its program, generated and
// built when the kernel is constructed (or found in the cache, built ahead of time by
// `python -m tf_autofuse codegen`), and runs each call through its ACL launcher first; a library
// that does not load or a launch that fails is one warning naming the kernel and the error, and
// from then on this kernel runs on the CPU. No path in the graph is ever loaded.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hoist.h"
#include "interpreter.h"
#include "kernel_profile.h"
#include "npu_dispatch.h"  // tf_autofuse/codegen/host (-I added by _build.py)
#include "output_cache.h"
#include "program.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/logging.h"
#include "tf_compat.h"
#include "variables.h"

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

// How a kernel uses the intra-op pool. The interpreter's cost units are rough (how many adds an
// erfc costs depends on the machine's vector unit), so each kernel times its first two inline
// runs (one is not enough: the first also faults in the thread's scratch). From then on every
// run goes to TensorFlow's ParallelFor with its cost per item in cycles, as TensorFlow's own
// elementwise kernels do: Eigen's cost model runs it inline when it is small (~100k cycles) and
// otherwise splits it over the pool. Deciding as TensorFlow does matters in a model: a kernel kept
// inline while the pool's threads idle lets them fall asleep, and the next MatMul pays to wake them
// (a 2-layer transformer at batch 1 ran ~9 % slower with kernels of up to 300 us kept inline).
// The estimate is the fastest rate any timed range showed, the pool's shards included, so it
// only comes down. Timing the first two runs alone was not enough: in a fresh process on a busy
// machine both can be many times slower than a warm run, and the example eleandreduce's
// reduction (~10 us) was then split over the pool at every step, whose woken threads spun on
// both cores (0.68x of TensorFlow's speed in the suite).
// Ranges below kTimedCost are not timed (too short to measure); from kProbeCost (~10 ms of work)
// the estimate alone sends a kernel to the pool, untimed.
constexpr int64_t kTimedCost = 100'000;
constexpr int64_t kProbeCost = 20'000'000;
// Eigen's cost model counts cycles; a measured nanosecond is taken as this many.
constexpr double kCyclesPerNs = 3.0;

// The node attr holding the IR ops the NPU kernel computes in half
// (--autofuse_enhance_precision_blacklist, stamped by codegen/cann.py); op names only, checked by
// the resolver. Attrs starting with '_' need no declaration in the op registration.
constexpr char kPrecisionBlacklistAttr[] = "_autofuse_precision_blacklist";

// Each distinct message once per process.
void WarnOnce(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string>* said = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!said->insert(message).second) return;
  }
  LOG(WARNING) << "tf_autofuse: " << message;
}

// The ACL device of the NPU launches: $ASCEND_DEVICE_ID, else 0.
int32_t NpuDevice() {
  const char* env = std::getenv("ASCEND_DEVICE_ID");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long id = std::strtol(env, &end, 10);
  return (*end == '\0' && id >= 0 && id < 1024) ? static_cast<int32_t>(id) : 0;
}

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
    case DType::kBool:
      return tensorflow::DT_BOOL;
  }
  return tensorflow::DT_INVALID;
}

// Tin and Tout must be the program's input and output dtypes; the program's inputs after Tin's
// are the `num_reads` variable reads of an AutofuseAssignKernel.
absl::Status CheckSignature(const Program& program, tensorflow::DataTypeSlice tin,
                            tensorflow::DataTypeSlice tout, size_t num_reads) {
  if (tin.size() + num_reads != program.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the node has ", tin.size(), " input(s)",
        num_reads == 0 ? "" : absl::StrCat(" and ", num_reads, " variable read(s)"),
        " but the program declares ", program.inputs.size()));
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
                         tensorflow::DataTypeSlice tout, size_t num_reads, const std::string& who,
                         Program* program) {
  absl::Status status = ParseProgram(text, program);
  if (status.ok()) status = CheckSignature(*program, tin, tout, num_reads);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat(who, ": ", status.message()));
}

std::string ShapeString(const TensorShape& shape) {  // "[2,3]"
  return absl::StrCat("[", absl::StrJoin(shape.dim_sizes(), ","), "]");
}

// A large output that TensorFlow has just allocated is usually fresh memory from the OS, and
// faulting it in 4 KiB pages costs several times the kernel's own work (a 64 MiB f32 output
// takes 16K page faults per run). Advising transparent huge pages before the first write
// divides the faults by 512; numpy does the same for its large arrays. Only the 2 MiB-aligned
// interior of the buffer is advised, so no neighbouring allocation is touched; it is a hint, and
// an error or THP=never changes nothing but the speed.
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

bool MatchesDecl(const TensorShape& shape, const ShapeDecl& decl) {
  if (decl.unknown_rank) return true;
  if (shape.dims() != static_cast<int>(decl.dims.size())) return false;
  for (int d = 0; d < shape.dims(); ++d) {
    if (decl.dims[d] >= 0 && decl.dims[d] != shape.dim_size(d)) return false;
  }
  return true;
}

ShapeHandle MakeShape(InferenceContext* c, const ShapeDecl& decl) {
  if (decl.unknown_rank) return c->UnknownShape();
  std::vector<DimensionHandle> dims;
  for (int64_t d : decl.dims) dims.push_back(d < 0 ? c->UnknownDim() : c->MakeDim(d));
  return c->MakeShape(dims);
}

// Element count of a fully defined shape, -1 otherwise.
int64_t KnownElements(InferenceContext* c, ShapeHandle shape) {
  if (!c->FullyDefined(shape)) return -1;
  int64_t n = 1;
  for (int d = 0; d < c->Rank(shape); ++d) n *= c->Value(c->Dim(shape, d));
  return n;
}

// A view (known rank, at most one "?") of something with `count` elements (-1: unknown): the "?"
// is resolved when the count is known.
absl::Status ResolveView(InferenceContext* c, const ShapeDecl& view, int64_t count,
                         const std::string& what, ShapeHandle* out) {
  int64_t known = 1;
  int unknown = -1;
  for (size_t d = 0; d < view.dims.size(); ++d) {
    if (view.dims[d] < 0) {
      unknown = static_cast<int>(d);
    } else {
      known *= view.dims[d];
    }
  }
  std::vector<DimensionHandle> dims;
  for (size_t d = 0; d < view.dims.size(); ++d) {
    if (view.dims[d] >= 0) {
      dims.push_back(c->MakeDim(view.dims[d]));
    } else if (count >= 0 && known > 0 && count % known == 0) {
      dims.push_back(c->MakeDim(count / known));
    } else {
      dims.push_back(c->UnknownDim());
    }
  }
  const bool fits = count < 0 ||
                    (unknown >= 0 ? (known == 0 ? count == 0 : count % known == 0)
                                  : known == count);
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", count,
                                                   " elements, which do not fit the view ",
                                                   ShapeString(view)));
  }
  *out = c->MakeShape(dims);
  return absl::OkStatus();
}

// The numpy broadcast of the views, as far as it is known: a dimension is known when some view
// has it known and not 1 (the others must agree or be 1), or when every view has it known.
absl::Status BroadcastViews(InferenceContext* c, const std::vector<ShapeHandle>& views,
                            ShapeHandle* out) {
  int rank = 0;
  for (ShapeHandle v : views) {
    if (!c->RankKnown(v)) {
      *out = c->UnknownShape();
      return absl::OkStatus();
    }
    rank = std::max(rank, c->Rank(v));
  }
  std::vector<DimensionHandle> dims;
  for (int a = 0; a < rank; ++a) {
    int64_t size = 1;
    bool unknown = false;
    for (size_t j = 0; j < views.size(); ++j) {
      const int offset = rank - c->Rank(views[j]);
      if (a < offset) continue;
      DimensionHandle d = c->Dim(views[j], a - offset);
      if (!c->ValueKnown(d)) {
        unknown = true;
        continue;
      }
      const int64_t v = c->Value(d);
      if (v == 1) continue;
      if (size != 1 && size != v) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the input views do not broadcast: dimension ", a - rank, " is ", size,
            " in one and ", v, " in input ", j, " (", c->DebugString(views[j]), ")"));
      }
      size = v;
    }
    dims.push_back(size == 1 && unknown ? c->UnknownDim() : c->MakeDim(size));
  }
  *out = c->MakeShape(dims);
  return absl::OkStatus();
}

absl::Status InferShapes(InferenceContext* c) {
  std::string text;
  DataTypeVector tin, tout;
  TF_RETURN_IF_ERROR(c->GetAttr("program", &text));
  TF_RETURN_IF_ERROR(c->GetAttr("Tin", &tin));
  TF_RETURN_IF_ERROR(c->GetAttr("Tout", &tout));
  Program program;
  std::vector<int> reads;  // an AutofuseAssignKernel's variable reads; an AutofuseKernel has none
  if (!c->GetAttr("reads", &reads).ok()) reads.clear();
  TF_RETURN_IF_ERROR(LoadProgram(text, tin, tout, reads.size(), "AutofuseKernel", &program));
  // Every input narrowed by its declaration, then read through its view; a variable read is
  // its declaration.
  const int num_tensor_inputs = static_cast<int>(tin.size());
  std::vector<ShapeHandle> views(program.inputs.size());
  for (int j = 0; j < static_cast<int>(program.inputs.size()); ++j) {
    const InputDecl& decl = program.inputs[j];
    ShapeHandle input = MakeShape(c, decl.shape);
    absl::Status status = absl::OkStatus();
    if (j < num_tensor_inputs) status = c->Merge(c->input(j), input, &input);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AutofuseKernel: input ", j, " has shape ", c->DebugString(c->input(j)),
          ", which does not match the program's in", j, ": ", DeclString(decl), ": ",
          status.message()));
    }
    views[j] = input;
    if (decl.has_view) {
      status = ResolveView(c, decl.view, KnownElements(c, input),
                           absl::StrCat("input ", j, " of shape ", c->DebugString(input)),
                           &views[j]);
      if (!status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "AutofuseKernel: ", status.message(), " (in", j, ": ", DeclString(decl), ")"));
      }
    }
  }
  ShapeHandle iteration;
  absl::Status status = BroadcastViews(c, views, &iteration);
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat("AutofuseKernel: ", status.message()));
  ShapeHandle reduced = iteration;
  if (program.has_reductions() && c->RankKnown(iteration)) {
    for (int a : program.axes) {
      TF_RETURN_IF_ERROR(c->ReplaceDim(reduced, a, c->MakeDim(1), &reduced));
    }
  }
  for (int k = 0; k < c->num_outputs(); ++k) {
    const Output& out = program.outputs[k];
    ShapeHandle shape = program.OutputReduced(k) ? reduced : iteration;
    if (out.has_view) {
      status = ResolveView(c, out.view, KnownElements(c, shape),
                           absl::StrCat("program line ", out.line, ": out", k, " of shape ",
                                        c->DebugString(shape)),
                           &shape);
      if (!status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("AutofuseKernel: ", status.message()));
      }
    }
    c->set_output(k, shape);
  }
  return absl::OkStatus();
}

class AutofuseKernelOp : public OpKernel {
 public:
  explicit AutofuseKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string text;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("program", &text));
    who_ = absl::StrCat("AutofuseKernel '", ctx->def().name(), "'");
    OP_REQUIRES_OK(ctx, VariableBindings::FromNode(ctx, &variables_));
    num_tensor_inputs_ = ctx->num_inputs() - variables_.num_variables;
    Program program;
    OP_REQUIRES_OK(ctx, LoadProgram(text, ctx->input_types().subspan(0, num_tensor_inputs_),
                                    ctx->output_types(), variables_.reads.size(), who_,
                                    &program));
    OP_REQUIRES_OK(ctx, variables_.CheckOutputs(program));
    num_inputs_ = static_cast<int>(program.inputs.size());
    HoistedProgram split;
    if (SplitInvariants(program, &split)) {  // hoist.h: invariants computed once per run
      prologue_ = std::make_unique<Interpreter>(std::move(split.prologue));
      prologue_inputs_ = std::move(split.prologue_inputs);
      program = std::move(split.main);
    }
    interpreter_ = std::make_unique<Interpreter>(std::move(program));
    profile_ = NewKernelProfile(name());  // AUTOFUSE_DFX_FLAGS=--kernel_profile=FILE, else null
    if (profile_ != nullptr) {
      interpreter_->set_profile(profile_);
      if (prologue_ != nullptr) prologue_->set_profile(profile_);
    }
    std::string blacklist;
    if (ctx->HasAttr(kPrecisionBlacklistAttr)) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(kPrecisionBlacklistAttr, &blacklist));
    }
    std::string why;
    npu_ = npu::Launcher::ForProgram(text, name(), blacklist, &why);
    if (npu_ == nullptr && !why.empty()) {
      WarnOnce(absl::StrCat("AutofuseKernel '", name(),
                            "': the NPU kernel library is not used, the CPU kernel runs: ", why));
    }
    if (npu_ != nullptr) npu_device_ = NpuDevice();
  }

  void Compute(OpKernelContext* ctx) override {
    if (profile_ == nullptr) {
      Run(ctx);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    Run(ctx);
    const int64_t elements = ctx->num_outputs() > 0 && ctx->mutable_output(0) != nullptr
                                 ? ctx->mutable_output(0)->NumElements()
                                 : 0;
    profile_->AddCall(std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start).count(),
                      elements);
  }

 private:
  void Run(OpKernelContext* ctx) {
    // An AutofuseAssignKernel holds its variables' locks until it has stored its outputs.
    LockedVariables variables;
    std::vector<Tensor> inputs(num_inputs_);
    for (int j = 0; j < num_tensor_inputs_; ++j) inputs[j] = ctx->input(j);
    if (!variables_.empty()) {
      OP_REQUIRES_OK(ctx, variables.Lock(ctx, num_tensor_inputs_, variables_.num_variables, who_));
      for (size_t r = 0; r < variables_.reads.size(); ++r) {
        OP_REQUIRES_OK(ctx, variables.Read(variables_.reads[r], who_,
                                           &inputs[num_tensor_inputs_ + r]));
      }
      for (size_t k = 0; k < variables_.writes.size(); ++k) {
        if (variables_.writes[k] < 0) continue;
        OP_REQUIRES_OK(ctx, variables.CheckWrite(variables_.writes[k],
                                                 ctx->expected_output_dtype(k), who_));
      }
    }
    if (!Compute(ctx, inputs)) return;
    for (size_t k = 0; k < variables_.writes.size(); ++k) {
      if (variables_.writes[k] < 0) continue;
      OP_REQUIRES_OK(ctx, variables.Write(variables_.writes[k], *ctx->mutable_output(k), who_));
    }
  }

  // Runs the program over `inputs` (the node's tensor inputs, then the variables it reads) into
  // the node's outputs; false after an error set on ctx.
  bool Compute(OpKernelContext* ctx, const std::vector<Tensor>& inputs) {
    const Program& program = interpreter_->program();
    std::vector<std::vector<int64_t>> shapes(num_inputs_);
    for (int j = 0; j < num_inputs_; ++j) {
      const TensorShape& input_shape = inputs[j].shape();
      if (j >= num_tensor_inputs_ &&
          inputs[j].dtype() != ToDataType(program.inputs[j].dtype)) {
        ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(
            who_, ": input ", j, " (a variable) has dtype ",
            tensorflow::DataTypeString(inputs[j].dtype()), " but the program declares in", j,
            ": ", DeclString(program.inputs[j]))));
        return false;
      }
      if (!MatchesDecl(input_shape, program.inputs[j].shape)) {
        ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(
            who_, ": input ", j, j >= num_tensor_inputs_ ? " (a variable)" : "",
            " has shape ", ShapeString(input_shape), " but the program declares in", j, ": ",
            DeclString(program.inputs[j]))));
        return false;
      }
      const auto dims = input_shape.dim_sizes();
      shapes[j].assign(dims.begin(), dims.end());
    }
    // The hoisted invariants' temporaries, which the main program reads as extra inputs; they are
    // computed below, only when the CPU kernel runs (the NPU kernel computes them itself).
    std::vector<Tensor> invariants;
    RunShape prun;
    IoBuffers pio;
    if (prologue_ != nullptr) {
      std::vector<std::vector<int64_t>> prologue_shapes;
      for (int j : prologue_inputs_) {
        prologue_shapes.push_back(shapes[j]);
        pio.inputs.push_back(inputs[j].tensor_data().data());
      }
      const absl::Status status = prologue_->Prepare(prologue_shapes, &prun);
      if (!status.ok()) {
        ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(who_, ": ", status.message())));
        return false;
      }
      const Program& prologue = prologue_->program();
      invariants.resize(prologue.outputs.size());
      for (size_t k = 0; k < prologue.outputs.size(); ++k) {
        const absl::Status allocated =
            ctx->allocate_temp(ToDataType(prologue.OutputDType(k)), TensorShape(prun.outputs[k]),
                               &invariants[k]);
        if (!allocated.ok()) {
          ctx->SetStatus(allocated);
          return false;
        }
        pio.outputs.push_back(const_cast<char*>(invariants[k].tensor_data().data()));
        shapes.push_back(prun.outputs[k]);
      }
    }
    RunShape run;
    const absl::Status status = interpreter_->Prepare(shapes, &run);
    if (!status.ok()) {
      ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(who_, ": ", status.message())));
      return false;
    }

    // An NPU launch that fails may have written some outputs: never let them share an input's
    // buffer, which the CPU fallback still reads.
    const bool try_npu = npu_ != nullptr && !npu_failed_.load(std::memory_order_relaxed) &&
                         run.num_elements > 0;
    IoBuffers io;
    io.inputs.resize(program.inputs.size());
    io.outputs.resize(ctx->num_outputs());
    for (int j = 0; j < num_inputs_; ++j) io.inputs[j] = inputs[j].tensor_data().data();
    for (size_t k = 0; k < invariants.size(); ++k) {
      io.inputs[num_inputs_ + k] = invariants[k].tensor_data().data();
    }
    for (int k = 0; k < ctx->num_outputs(); ++k) {
      const TensorShape shape(run.outputs[k]);
      // Only a node input of exactly the output's shape (and dtype, and not broadcast); never
      // a variable's value, which its variable still holds.
      std::vector<int> candidates;
      for (int j : interpreter_->ForwardableInputs(run, k)) {
        if (j < num_tensor_inputs_ && ctx->input(j).shape() == shape && !try_npu) {
          candidates.push_back(j);
        }
      }
      Tensor* output = nullptr;
      for (int j : candidates) {
        if (ctx->forward_input_to_output_with_shape(j, k, shape, &output)) break;
      }
      if (output == nullptr) {
        const absl::Status allocated = AllocateOutput(ctx, k, shape, &output);
        if (!allocated.ok()) {
          ctx->SetStatus(allocated);
          return false;
        }
      }
      io.outputs[k] = const_cast<char*>(output->tensor_data().data());
    }

    if (try_npu && RunOnNpu(ctx, inputs, run, io)) return true;
    if (prologue_ != nullptr) {
      pio.shared = SharedMemory(prologue_->SharedBytes(prun), /*slot=*/0);
      prologue_->RunAll(prun, pio);
    }
    io.shared = SharedMemory(interpreter_->SharedBytes(run), /*slot=*/1);
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    for (const Phase& phase : interpreter_->Phases(run)) RunPhase(workers, run, io, phase);
    return true;
  }
  // A split run's memory shared by its phases (IoBuffers::shared), `bytes` of it, or null for
  // none: a buffer of the calling thread kept for its next calls (slot 0: the prologue's, 1: the
  // program's), so that a step does not allocate and fault in fresh pages for it.
  static char* SharedMemory(int64_t bytes, int slot) {
    if (bytes == 0) return nullptr;
    thread_local std::vector<char> buffers[2];
    std::vector<char>& buffer = buffers[slot];
    if (static_cast<int64_t>(buffer.size()) < bytes) buffer.resize(bytes);
    return buffer.data();
  }

  // One phase of the run: inline, or over the intra-op pool (see kTimedCost above).
  void RunPhase(tensorflow::thread::ThreadPool* workers, const RunShape& run, const IoBuffers& io,
                Phase phase) {
    const int64_t num_items = interpreter_->NumItems(run, phase);
    if (num_items == 0) return;
    const int64_t cost = interpreter_->TotalCost(run, phase);
    bool inline_run = num_items == 1 || workers == nullptr || workers->NumThreads() <= 1;
    const double ns_per_cost = timed_runs_.load(std::memory_order_relaxed) >= 2
                                   ? ns_per_cost_.load(std::memory_order_relaxed)
                                   : 0;
    if (!inline_run && ns_per_cost == 0) inline_run = cost < kProbeCost;  // to be timed
    if (inline_run) {
      RunTimed(run, io, 0, num_items, cost, phase);
      if (cost >= kTimedCost && timed_runs_.load(std::memory_order_relaxed) < 2) {
        timed_runs_.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
    const double per_item = static_cast<double>(interpreter_->CostPerItem(run, phase));
    const double cycles_per_item =
        ns_per_cost > 0 ? per_item * ns_per_cost * kCyclesPerNs : per_item;
    workers->ParallelFor(
        num_items,
        tf_compat::AdaptiveScheduling(std::max<int64_t>(1, static_cast<int64_t>(cycles_per_item))),
        [&](int64_t first, int64_t last) {
          RunTimed(run, io, first, last, static_cast<int64_t>(per_item) * (last - first), phase);
        });
  }

  // Runs items [first, last) of `phase`, `cost` cost units, on this thread. A range of at
  // least kTimedCost is timed and may lower the kernel's estimate: the fastest rate seen, since a
  // range the OS preempted or that faulted in fresh memory only looks slower. Ranges run by the
  // pool count too, so an estimate a slow first run made too high (a fresh process, a busy
  // machine) comes down within a step or two instead of splitting a small kernel over the pool
  // for good.
  void RunTimed(const RunShape& run, const IoBuffers& io, int64_t first, int64_t last,
                int64_t cost, Phase phase) {
    if (cost < kTimedCost) {
      interpreter_->RunItems(run, io, first, last, phase);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    interpreter_->RunItems(run, io, first, last, phase);
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    const double rate = ns / static_cast<double>(cost);
    double seen = ns_per_cost_.load(std::memory_order_relaxed);
    while ((seen == 0 || rate < seen) &&
           !ns_per_cost_.compare_exchange_weak(seen, rate, std::memory_order_relaxed)) {
    }
  }

  // A new output tensor: a large one from the output cache (output_cache.h), which reuses the
  // blocks of earlier steps' outputs, the others from TensorFlow's allocator.
  absl::Status AllocateOutput(OpKernelContext* ctx, int k, const TensorShape& shape,
                              Tensor** output) {
    const DataType dtype = ctx->expected_output_dtype(k);
    const int64_t bytes = shape.num_elements() * tensorflow::DataTypeSize(dtype);
    if (tensorflow::Allocator* cache = OutputCacheFor(bytes)) {
      Tensor cached(cache, dtype, shape);
      if (cached.IsInitialized()) {  // else out of memory there: TensorFlow's allocator decides
        ctx->set_output(k, cached);
        *output = ctx->mutable_output(k);
        return absl::OkStatus();
      }
    }
    TF_RETURN_IF_ERROR(ctx->allocate_output(k, shape, output));
    AdviseHugePages(const_cast<char*>((*output)->tensor_data().data()), (*output)->TotalBytes());
    return absl::OkStatus();
  }

  // The NPU path: the launcher copies the host buffers to the device and the results back.
  // false (after one warning, and for good for this kernel) when it fails: run on the CPU.
  bool RunOnNpu(OpKernelContext* ctx, const std::vector<Tensor>& values, const RunShape& run,
                const IoBuffers& io) {
    // the program's inputs only: the generated kernel computes the hoisted invariants itself
    std::vector<const void*> inputs(io.inputs.begin(), io.inputs.begin() + num_inputs_);
    std::vector<void*> outputs(io.outputs.begin(), io.outputs.end());
    std::vector<uint64_t> counts(num_inputs_);
    for (int j = 0; j < num_inputs_; ++j) {
      counts[j] = static_cast<uint64_t>(values[j].NumElements());
    }
    std::string error;
    if (npu_->Run(inputs, outputs, static_cast<uint64_t>(run.num_elements), &error,
                  /*core_num=*/0, npu_device_, /*stream=*/nullptr, run.iteration, counts)) {
      return true;
    }
    if (!npu_failed_.exchange(true)) {
      WarnOnce(absl::StrCat("AutofuseKernel '", name(),
                            "': the NPU launch failed, this kernel runs on the CPU from now on: ",
                            error));
    }
    return false;
  }

  std::string who_;            // the messages' subject: "AutofuseKernel 'name'"
  int num_inputs_ = 0;         // the program's: the node's tensor inputs, then variable reads
  int num_tensor_inputs_ = 0;  // the node's inputs before the variables' handles
  VariableBindings variables_;  // an AutofuseAssignKernel's; empty otherwise
  std::unique_ptr<Interpreter> prologue_;     // the hoisted invariants, or null
  std::vector<int> prologue_inputs_;          // the node input each prologue input is
  std::unique_ptr<Interpreter> interpreter_;  // the program (its main part when hoisted)
  std::unique_ptr<npu::Launcher> npu_;  // null: the CPU path only
  int32_t npu_device_ = 0;
  std::atomic<bool> npu_failed_{false};
  std::atomic<double> ns_per_cost_{0};  // fastest timed range, ns per cost unit; 0: none yet
  std::atomic<int> timed_runs_{0};     // timed inline runs, counted up to 2
  KernelProfile* profile_ = nullptr;    // --kernel_profile, else null
};

}  // namespace

REGISTER_OP("AutofuseKernel")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 1")
    .Attr("Tout: list(type) >= 1")
    .Attr("program: string")
    .SetShapeFn(InferShapes);

// A fused kernel that also stores outputs into resource variables, and may read variables as
// inputs (variables.h). Stateful: it must run even when nothing reads its outputs, and never be
// merged with another by common-subexpression elimination.
REGISTER_OP("AutofuseAssignKernel")
    .Input("inputs: Tin")
    .Input("variables: num_variables * resource")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("num_variables: int >= 1")
    .Attr("reads: list(int) = []")
    .Attr("writes: list(int) = []")
    .Attr("program: string")
    .SetIsStateful()
    .SetShapeFn(InferShapes);

REGISTER_KERNEL_BUILDER(Name("AutofuseKernel").Device(tensorflow::DEVICE_CPU), AutofuseKernelOp);
REGISTER_KERNEL_BUILDER(Name("AutofuseAssignKernel").Device(tensorflow::DEVICE_CPU),
                        AutofuseKernelOp);

}  // namespace tf_autofuse

// The Python side (codegen/cann.py) registers the resolver of NPU kernel libraries here when a
// CANN toolchain is present; null unregisters it.
extern "C" __attribute__((visibility("default"))) void autofuse_set_npu_resolver(
    tf_autofuse::npu::Resolver resolver) {
  tf_autofuse::npu::ResolverSlot().store(resolver, std::memory_order_release);
}
