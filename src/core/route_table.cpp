#include "core/route_table.h"

namespace mlx_lattice {

namespace {

struct Table {
  Backend backend;
  const char* label;
  std::vector<RouteEntry> entries;
};

std::vector<Table>& tables() {
  static std::vector<Table> all;
  return all;
}

} // namespace

void register_routes(Backend backend, const char* label, std::vector<RouteEntry> entries) {
  for (const auto& t : tables()) {
    if (t.backend == backend) {
      return; // registered once
    }
  }
  tables().push_back({backend, label, std::move(entries)});
}

void wrong_route_op(const std::string& name, Op has, Op want) {
  throw std::invalid_argument(
      "route " + name + " runs under the " + op_name(has) + " primitive, not " + op_name(want));
}

FoundRoute find_route(const std::string& name, Op op) {
  std::string labels;
  for (const auto& t : tables()) {
    if (const RouteEntry* e = find_entry(t.entries, name, op)) {
      return {t.backend, *e};
    }
    labels += labels.empty() ? t.label : std::string(" or ") + t.label;
  }
  throw std::invalid_argument("no " + labels + " route named " + name);
}

std::vector<RouteEntry> registered_routes() {
  std::vector<RouteEntry> out;
  for (const auto& t : tables()) {
    out.insert(out.end(), t.entries.begin(), t.entries.end());
  }
  return out;
}

} // namespace mlx_lattice
