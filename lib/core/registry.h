// A named registry of factories (placement algorithms and PEC selection policies each had
// their own). Implementations register themselves from a namespace-scope initializer in their own
// file; lookups list the known names when a name is unknown.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ucpkit {

template <class Interface>
class Registry {
 public:
  using Factory = std::function<std::unique_ptr<Interface>()>;

  // `kind` names what is registered in the error for an unknown name ("algorithm", "selection policy").
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  void add(const std::string& name, Factory factory) {
    std::lock_guard lock(mu_);
    factories_[name] = std::move(factory);
  }

  // A new instance of `name`; UsageError "unknown <kind> '<name>' (known: a, b, c)" when none.
  std::unique_ptr<Interface> make(std::string_view name) const {
    std::lock_guard lock(mu_);
    auto it = factories_.find(std::string(name));
    if (it == factories_.end()) {
      std::string known;
      for (const auto& [n, f] : factories_) known += (known.empty() ? "" : ", ") + n;
      throw UsageError("unknown " + kind_ + " '" + std::string(name) + "' (known: " + known + ")");
    }
    return it->second();
  }

  // Registered names, sorted.
  std::vector<std::string> names() const {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (const auto& [n, f] : factories_) out.push_back(n);
    return out;
  }

 private:
  std::string kind_;
  mutable std::mutex mu_;
  std::map<std::string, Factory> factories_;
};

// A named table of values (functions a format registers for one capability: ucp-union's runner,
// ucp-info's describer): set from namespace-scope initializers, looked up by name.
template <class T>
class NamedTable {
 public:
  // Returns true, for a namespace-scope initializer.
  bool set(const std::string& name, T value) {
    std::lock_guard lock(mu_);
    values_[name] = std::move(value);
    return true;
  }
  // The value registered under `name`, or T{} when none.
  T find(const std::string& name) const {
    std::lock_guard lock(mu_);
    auto it = values_.find(name);
    return it == values_.end() ? T{} : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, T> values_;
};

}  // namespace ucpkit
