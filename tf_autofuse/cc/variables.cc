#include "variables.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/types.h"

namespace tf_autofuse {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

absl::Status VariableBindings::FromNode(OpKernelConstruction* ctx, VariableBindings* out) {
  *out = VariableBindings();
  if (!ctx->HasAttr("num_variables")) return absl::OkStatus();
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_variables", &out->num_variables));
  TF_RETURN_IF_ERROR(ctx->GetAttr("reads", &out->reads));
  TF_RETURN_IF_ERROR(ctx->GetAttr("writes", &out->writes));
  for (int v : out->reads) {
    if (v < 0 || v >= out->num_variables) {
      return absl::InvalidArgumentError(absl::StrCat("`reads` names variable ", v, " of ",
                                                     out->num_variables));
    }
  }
  for (int v : out->writes) {
    if (v < -1 || v >= out->num_variables) {
      return absl::InvalidArgumentError(absl::StrCat("`writes` names variable ", v, " of ",
                                                     out->num_variables));
    }
  }
  return absl::OkStatus();
}

absl::Status VariableBindings::CheckOutputs(const Program& program) const {
  if (!writes.empty() && writes.size() != program.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("`writes` has ", writes.size(),
                                                   " entries for ", program.outputs.size(),
                                                   " output(s)"));
  }
  return absl::OkStatus();
}

LockedVariables::~LockedVariables() {
  for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) (*it)->unlock();
}

absl::Status LockedVariables::Lock(OpKernelContext* ctx, int first_handle, int count,
                                   const std::string& who) {
  vars_.resize(count);
  for (int i = 0; i < count; ++i) {
    const absl::Status status =
        tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, first_handle + i),
                                   &vars_[i]);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(who, ": variable ", i, " (input ",
                                                      first_handle + i, "): ",
                                                      status.message()));
    }
  }
  std::vector<tensorflow::mutex*> order;
  for (const auto& var : vars_) order.push_back(var->mu());
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  for (tensorflow::mutex* mu : order) {
    mu->lock();
    locked_.push_back(mu);
  }
  return absl::OkStatus();
}

absl::Status LockedVariables::Read(int v, const std::string& who, Tensor* value) const {
  tensorflow::Var* var = vars_[v].get();
  if (!var->is_initialized) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": reads variable ", v, ", which is not initialized (", var->DebugString(), ")"));
  }
  *value = *var->tensor();
  return absl::OkStatus();
}

absl::Status LockedVariables::CheckWrite(int v, tensorflow::DataType dtype,
                                         const std::string& who) const {
  tensorflow::Var* var = vars_[v].get();
  if (var->is_initialized && var->tensor()->dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": stores ", tensorflow::DataTypeString(dtype), " into variable ", v, " of dtype ",
        tensorflow::DataTypeString(var->tensor()->dtype())));
  }
  return absl::OkStatus();
}

absl::Status LockedVariables::Write(int v, const Tensor& value, const std::string& who) {
  tensorflow::Var* var = vars_[v].get();
  if (var->is_initialized && var->tensor()->shape() != value.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": stores a value of shape ", value.shape().DebugString(), " into variable ", v,
        " of shape ", var->tensor()->shape().DebugString()));
  }
  *var->tensor() = value;
  var->is_initialized = true;
  return absl::OkStatus();
}

}  // namespace tf_autofuse
