// The Grappler bridge: hands each graph TensorFlow optimizes to the Python rewriter
// (tf_autofuse._bridge.optimize) and takes the rewritten GraphDef back.
//
// Registered twice: always as the named custom optimizer "AutofuseOptimizer" (listed in a
// session's RewriterConfig.custom_optimizers, whose parameter_map overrides flags), and, when
// Python asks for it (the flags enable fusion), as TensorFlow's CPU plugin optimizer, which
// runs on every CPU graph of the process with no config edit.
//
// The bridge never fails a session: on any error it returns Aborted, which Grappler reads as
// "no change", and the graph runs unfused. Graphs with no candidate op leave before Python is
// called, since the pass sees every graph TensorFlow optimizes (tf.data's included).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/grappler/costs/graph_properties.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_autofuse {
namespace {

using ::tensorflow::GraphDef;
using ::tensorflow::RewriterConfig_CustomGraphOptimizer;
using ::tensorflow::grappler::Cluster;
using ::tensorflow::grappler::CustomGraphOptimizer;
using ::tensorflow::grappler::GrapplerItem;

constexpr char kComposition[] = "_UnaryOpsComposition";

// Op types the rewriter may fuse, set once from Python's catalog (no second table here).
std::mutex candidates_mu;
std::set<std::string>* candidate_ops = new std::set<std::string>();

bool IsCandidate(const std::string& op) {
  std::lock_guard<std::mutex> lock(candidates_mu);
  return candidate_ops->count(op) > 0;
}

// A fused kernel needs two compute ops; a _UnaryOpsComposition alone holds two or more.
bool MayHoldFusion(const GraphDef& graph) {
  int seen = 0;
  for (const auto& node : graph.node()) {
    if (node.op() == kComposition) return true;
    if (IsCandidate(node.op()) && ++seen >= 2) return true;
  }
  return false;  // function bodies are optimized as graphs of their own
}

// Owned references, released with the GIL held.
struct PyRef {
  PyObject* obj;
  explicit PyRef(PyObject* o) : obj(o) {}
  ~PyRef() { Py_XDECREF(obj); }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
};

std::string FetchPythonError() {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  std::string text = "unknown Python error";
  if (value != nullptr) {
    PyObject* str = PyObject_Str(value);
    if (str != nullptr) {
      const char* utf8 = PyUnicode_AsUTF8(str);
      if (utf8 != nullptr) text = utf8;
      Py_DECREF(str);
    }
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return text;
}

PyObject* StringList(const std::vector<std::string>& items) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(items.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* s = PyUnicode_FromStringAndSize(items[i].data(), items[i].size());
    if (s == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i, s);
  }
  return list;
}

// {node name: [shape or None per output]}, shape a tuple of sizes (see below for unknown ones).
PyObject* ShapeDict(const GrapplerItem& item, const tensorflow::grappler::GraphProperties* props) {
  PyObject* dict = PyDict_New();
  if (dict == nullptr || props == nullptr) return dict;
  for (const auto& node : item.graph.node()) {
    if (!props->HasOutputProperties(node.name())) continue;
    const auto& outputs = props->GetOutputProperties(node.name());
    PyRef shapes(PyList_New(static_cast<Py_ssize_t>(outputs.size())));
    if (shapes.obj == nullptr) return dict;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const tensorflow::TensorShapeProto& shape = outputs[i].shape();
      PyObject* entry;
      if (shape.unknown_rank()) {
        Py_INCREF(Py_None);
        entry = Py_None;
      } else {
        entry = PyTuple_New(shape.dim_size());
        for (int d = 0; d < shape.dim_size(); ++d) {
          int64_t size = shape.dim(d).size();
          // -1: unknown; <= -2: a symbolic size, equal ids are equal sizes in this graph.
          PyTuple_SET_ITEM(entry, d, PyLong_FromLongLong(size));
        }
      }
      PyList_SET_ITEM(shapes.obj, i, entry);
    }
    PyDict_SetItemString(dict, node.name().c_str(), shapes.obj);
  }
  return dict;
}

void WarnOnce(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string>* said = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (said->insert(message).second) LOG(WARNING) << "tf_autofuse: " << message;
}

class AutofuseOptimizer : public CustomGraphOptimizer {
 public:
  explicit AutofuseOptimizer(bool as_plugin = false) : as_plugin_(as_plugin) {}

  std::string name() const override {
    return as_plugin_ ? "AutofuseOptimizer(plugin)" : "AutofuseOptimizer";
  }
  bool UsesFunctionLibrary() const override { return false; }

  absl::Status Init(const RewriterConfig_CustomGraphOptimizer* config) override {
    params_.clear();
    if (config == nullptr) return absl::OkStatus();
    for (const auto& entry : config->parameter_map()) {
      const auto& value = entry.second;
      std::string text;
      switch (value.value_case()) {
        case tensorflow::AttrValue::kS: text = value.s(); break;
        case tensorflow::AttrValue::kB: text = value.b() ? "true" : "false"; break;
        case tensorflow::AttrValue::kI: text = std::to_string(value.i()); break;
        default: text = value.DebugString();  // Python names the key and rejects it
      }
      params_.emplace_back(entry.first, text);
    }
    return absl::OkStatus();
  }

  absl::Status Optimize(Cluster* cluster, const GrapplerItem& item,
                        GraphDef* optimized_graph) override {
    if (!MayHoldFusion(item.graph)) return absl::AbortedError("nothing to fuse");
    if (!Py_IsInitialized()) return absl::AbortedError("no Python interpreter");

    // Static shapes let the rewriter prove that binary operands have equal shapes.
    std::unique_ptr<tensorflow::grappler::GraphProperties> props(
        new tensorflow::grappler::GraphProperties(item));
    if (!props->InferStatically(/*assume_valid_feeds=*/false,
                                /*aggressive_shape_inference=*/false,
                                /*include_input_tensor_values=*/false,
                                /*include_output_tensor_values=*/false)
             .ok()) {
      props.reset();
    }
    std::string serialized;
    if (!item.graph.SerializeToString(&serialized)) {
      return absl::AbortedError("graph does not serialize");
    }
    std::vector<std::string> preserve(item.NodesToPreserve().begin(),
                                      item.NodesToPreserve().end());
    std::sort(preserve.begin(), preserve.end());
    std::vector<std::string> feeds;
    for (const auto& feed : item.feed) feeds.push_back(feed.first);

    std::string rewritten;
    bool changed = false;
    std::string error;
    {
      PyGILState_STATE gil = PyGILState_Ensure();
      changed = CallRewriter(serialized, preserve, feeds, item, props.get(), &rewritten, &error);
      PyGILState_Release(gil);
    }
    if (!error.empty()) {
      WarnOnce("the fusion pass failed, the graph runs unfused: " + error);
      return absl::AbortedError(error);
    }
    if (!changed) return absl::AbortedError("nothing fused");
    if (!optimized_graph->ParseFromString(rewritten)) {
      WarnOnce("the rewriter returned a GraphDef that does not parse; the graph runs unfused");
      return absl::AbortedError("bad rewritten graph");
    }
    return absl::OkStatus();
  }

 private:
  // Calls tf_autofuse._bridge.optimize; GIL held. Returns true when the graph changed.
  bool CallRewriter(const std::string& serialized, const std::vector<std::string>& preserve,
                    const std::vector<std::string>& feeds, const GrapplerItem& item,
                    const tensorflow::grappler::GraphProperties* props, std::string* rewritten,
                    std::string* error) {
    PyRef module(PyImport_ImportModule("tf_autofuse._bridge"));
    if (module.obj == nullptr) {
      *error = "cannot import tf_autofuse._bridge: " + FetchPythonError();
      return false;
    }
    PyRef fn(PyObject_GetAttrString(module.obj, "optimize"));
    PyRef graph(PyBytes_FromStringAndSize(serialized.data(), serialized.size()));
    PyRef keep(StringList(preserve));
    PyRef fed(StringList(feeds));
    PyRef shapes(ShapeDict(item, props));
    PyRef params(PyDict_New());
    if (fn.obj == nullptr || graph.obj == nullptr || keep.obj == nullptr || fed.obj == nullptr ||
        shapes.obj == nullptr || params.obj == nullptr) {
      *error = "cannot prepare the rewriter call: " + FetchPythonError();
      return false;
    }
    for (const auto& kv : params_) {
      PyRef value(PyUnicode_FromString(kv.second.c_str()));
      PyDict_SetItemString(params.obj, kv.first.c_str(), value.obj);
    }
    PyRef result(PyObject_CallFunction(fn.obj, "OOOOOs", graph.obj, keep.obj, fed.obj,
                                       shapes.obj, params.obj,
                                       as_plugin_ ? "plugin" : "custom_optimizer"));
    if (result.obj == nullptr) {
      *error = "tf_autofuse._bridge.optimize raised: " + FetchPythonError();
      return false;
    }
    if (result.obj == Py_None) return false;
    char* data = nullptr;
    Py_ssize_t size = 0;
    if (PyBytes_AsStringAndSize(result.obj, &data, &size) != 0) {
      *error = "tf_autofuse._bridge.optimize returned no bytes: " + FetchPythonError();
      return false;
    }
    rewritten->assign(data, size);
    return true;
  }

  bool as_plugin_;
  std::vector<std::pair<std::string, std::string>> params_;
};

}  // namespace

REGISTER_GRAPH_OPTIMIZER_AS(AutofuseOptimizer, "AutofuseOptimizer");

}  // namespace tf_autofuse

// C entry points for tf_autofuse/_native.py (ctypes).
extern "C" {

__attribute__((visibility("default"))) void autofuse_set_candidate_ops(const char* names) {
  std::lock_guard<std::mutex> lock(tf_autofuse::candidates_mu);
  tf_autofuse::candidate_ops->clear();
  std::string all(names);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) tf_autofuse::candidate_ops->insert(all.substr(start, end - start));
    start = end + 1;
  }
}

static std::mutex plugin_mu;
static bool plugin_registered = false;

// TensorFlow's only CPU plugin slot, without taking it: 0 free, 1 ours, 2 another plugin's.
__attribute__((visibility("default"))) int autofuse_cpu_plugin_slot() {
  using ::tensorflow::grappler::PluginGraphOptimizerRegistry;
  std::lock_guard<std::mutex> lock(plugin_mu);
  if (plugin_registered) return 1;
  return PluginGraphOptimizerRegistry::CreateOptimizers({"CPU"}).empty() ? 0 : 2;
}

// 0: registered now; 1: we registered before; 2: another CPU plugin holds the slot.
__attribute__((visibility("default"))) int autofuse_register_cpu_plugin() {
  using ::tensorflow::grappler::PluginGraphOptimizerRegistry;
  std::lock_guard<std::mutex> lock(plugin_mu);
  if (plugin_registered) return 1;
  if (!PluginGraphOptimizerRegistry::CreateOptimizers({"CPU"}).empty()) return 2;
  // No toggles: TensorFlow's own passes keep the session's settings.
  ::tensorflow::grappler::ConfigList configs(/*disable_model_pruning=*/false, {});
  PluginGraphOptimizerRegistry::RegisterPluginOptimizerOrDie(
      []() { return new tf_autofuse::AutofuseOptimizer(/*as_plugin=*/true); }, "CPU", configs);
  plugin_registered = true;
  return 0;
}

}  // extern "C"
