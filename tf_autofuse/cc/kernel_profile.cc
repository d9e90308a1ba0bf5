// See kernel_profile.h.

#include "kernel_profile.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tf_autofuse {
namespace {

std::mutex registry_mu;
std::string* profile_path = new std::string();                   // empty: profiling off
std::vector<KernelProfile*>* profiles = new std::vector<KernelProfile*>();  // never freed

std::string Quoted(const std::string& text) {  // a CSV field
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void WriteProfiles() {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (profile_path->empty()) return;
  FILE* file = std::fopen(profile_path->c_str(), "w");
  if (file == nullptr) {
    std::fprintf(stderr, "tf_autofuse: --kernel_profile: cannot write %s\n", profile_path->c_str());
    return;
  }
  std::fputs("kernel,step,what,runs,elements,total_us,ns_per_element,share\n", file);
  for (const KernelProfile* profile : *profiles) std::fputs(profile->Rows().c_str(), file);
  std::fclose(file);
  std::fprintf(stderr, "tf_autofuse: kernel profile of %zu kernel(s) written to %s\n",
               profiles->size(), profile_path->c_str());
}

}  // namespace

void KernelProfile::AddStep(const void* key, const std::function<std::string()>& label,
                            int64_t ns, int64_t elements) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = steps_.try_emplace(key);
  Entry& entry = it->second;
  if (inserted) {
    entry.order = static_cast<int64_t>(steps_.size());
    entry.label = label();
  }
  ++entry.runs;
  entry.elements += elements;
  entry.ns += ns;
}

void KernelProfile::AddCall(int64_t ns, int64_t elements) {
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_;
  call_elements_ += elements;
  call_ns_ += ns;
}

std::string KernelProfile::Rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Entry*> ordered(steps_.size());
  int64_t steps_ns = 0;
  for (const auto& [key, entry] : steps_) {
    ordered[entry.order - 1] = &entry;
    steps_ns += entry.ns;
  }
  auto row = [&](const std::string& step, const std::string& what, int64_t runs,
                 int64_t elements, int64_t ns, double share) {
    return absl::StrFormat("%s,%s,%s,%d,%d,%.1f,%.3f,%.3f\n", Quoted(kernel_), step, Quoted(what),
                           runs, elements, ns / 1e3, elements > 0 ? double(ns) / elements : 0.0,
                           share);
  };
  std::string out = row("call", "Compute (wall time of whole calls)", calls_, call_elements_,
                        call_ns_, 1.0);
  for (size_t i = 0; i < ordered.size(); ++i) {
    const Entry& e = *ordered[i];
    out += row(absl::StrCat(i), e.label, e.runs, e.elements, e.ns,
               steps_ns > 0 ? double(e.ns) / steps_ns : 0.0);
  }
  return out;
}

KernelProfile* NewKernelProfile(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (profile_path->empty()) return nullptr;
  profiles->push_back(new KernelProfile(name));
  return profiles->back();
}

}  // namespace tf_autofuse

// C entry point for tf_autofuse/_native.py (ctypes): where the profile is written at exit.
extern "C" __attribute__((visibility("default"))) void autofuse_set_kernel_profile(
    const char* path) {
  static bool registered = false;
  std::lock_guard<std::mutex> lock(tf_autofuse::registry_mu);
  *tf_autofuse::profile_path = path == nullptr ? "" : path;
  if (!registered && !tf_autofuse::profile_path->empty()) {
    registered = true;
    std::atexit(tf_autofuse::WriteProfiles);
  }
}
