// The native backends' route tables as the primitives see them: each
// backend registers its table (cpu::register_routes, metal::register_routes,
// called by the extension's module init), and a route's backend is the
// table that holds it, not a reading of its name.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/relation.h"
#include "core/route_op.h"

namespace mlx_lattice {

enum class Backend { Cpu, Metal };

// Arrays a route reads after the view's (offsets, gather, k), for that view.
using ExtraInputs = std::vector<mx::array> (*)(Relation& rel, View view);

// What the primitives read of an entry, whichever table holds it.
struct RouteEntry {
  const char* name;
  Op op; // the primitive that runs it
  ExtraInputs extra_inputs = nullptr;
  // Its kernels take a grouped product's weight (K, A / groups, B) and the
  // group count; the registry's Route.grouped says the same (one fact,
  // checked by tests/test_routes.py), and selection keeps groups > 1 to
  // these routes.
  bool grouped = false;
};

// Adds a backend's entries (`label` names the table in messages).
void register_routes(Backend backend, const char* label, std::vector<RouteEntry> entries);

struct FoundRoute {
  Backend backend;
  const RouteEntry& entry;
};
// The registered entry of `name`, which must run under `op`.
FoundRoute find_route(const std::string& name, Op op);

// Every registered entry, table by table.
std::vector<RouteEntry> registered_routes();

[[noreturn]] void wrong_route_op(const std::string& name, Op has, Op want);

// The entry named `name` in one table (entries or pointers to them, each
// with name and op), nullptr where there is none; raises where it runs
// under another primitive than `op`. The one lookup of every table.
template <class Entries>
auto find_entry(const Entries& entries, const std::string& name, Op op) {
  using Item = typename Entries::value_type;
  constexpr bool pointers = std::is_pointer_v<Item>;
  using Entry = std::remove_cv_t<std::remove_pointer_t<Item>>;
  for (const auto& item : entries) {
    const Entry* e;
    if constexpr (pointers) {
      e = item;
    } else {
      e = &item;
    }
    if (name == e->name) {
      if (e->op != op) {
        wrong_route_op(name, e->op, op);
      }
      return e;
    }
  }
  return static_cast<const Entry*>(nullptr);
}

} // namespace mlx_lattice
