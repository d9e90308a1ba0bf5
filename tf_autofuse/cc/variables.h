// The variables an AutofuseAssignKernel reads and writes (docs/PROGRAM.md, Variables).
//
// A fused kernel that ends an optimizer step stores some of its outputs into resource variables
// (what AssignVariableOp did) and reads the current value of others to add its output to them
// (AssignAddVariableOp: the program computes v + x as one more output, stored into v). The node
// takes the variables' handles after its tensor inputs; its attrs say which trailing program
// inputs read which variable (`reads`) and which outputs are stored into which (`writes`).
//
// While the kernel runs it holds every variable's lock (taken in address order, as TensorFlow's
// own training ops do), so a read-add-store is atomic like AssignAddVariableOp. A variable never
// changes in place: it adopts the output's buffer, so a tensor read from it earlier (a
// ReadVariableOp's output shares its buffer) keeps its value, whatever copy-on-read mode says.

#ifndef TF_AUTOFUSE_CC_VARIABLES_H_
#define TF_AUTOFUSE_CC_VARIABLES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "program.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_autofuse {

// The node attrs: which variable each trailing program input reads, which each output is
// stored into (-1: none). An AutofuseKernel has none.
struct VariableBindings {
  int num_variables = 0;
  std::vector<int> reads;   // per program input after the node's tensor inputs
  std::vector<int> writes;  // per output, -1 for none; empty: no output is stored

  bool empty() const { return num_variables == 0; }
  // From the node's attrs (none when it has no `num_variables`), each index in range.
  static absl::Status FromNode(tensorflow::OpKernelConstruction* ctx, VariableBindings* out);
  // `writes` has one entry per output of `program`, or none. (The program's input count is
  // checked with the node's signature: Tin, then `reads`.)
  absl::Status CheckOutputs(const Program& program) const;
};

// The variables of one run, looked up and locked; unlocked when destroyed.
class LockedVariables {
 public:
  LockedVariables() = default;
  LockedVariables(const LockedVariables&) = delete;
  LockedVariables& operator=(const LockedVariables&) = delete;
  ~LockedVariables();

  // Looks up the handles (node inputs first_handle...) and locks them; `who` starts messages.
  absl::Status Lock(tensorflow::OpKernelContext* ctx, int first_handle, int count,
                    const std::string& who);
  // The current value of variable `v` (an error when it is not initialized).
  absl::Status Read(int v, const std::string& who, tensorflow::Tensor* value) const;
  // A store of `dtype` into variable `v` is allowed (an initialized variable keeps its dtype).
  absl::Status CheckWrite(int v, tensorflow::DataType dtype, const std::string& who) const;
  // Variable `v` adopts `value`'s buffer; an initialized variable keeps its shape (an
  // error otherwise, as AssignVariableOp's validate_shape and AssignAddVariableOp give).
  absl::Status Write(int v, const tensorflow::Tensor& value, const std::string& who);

 private:
  std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> vars_;  // per handle
  std::vector<tensorflow::mutex*> locked_;                            // distinct, in order
};

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_VARIABLES_H_
