#include "node/view_sync.h"

#include <algorithm>
#include <iterator>

namespace setpoint {
namespace {

bool IsOwn(const std::vector<std::string>& own, const std::string& id) {
  return std::binary_search(own.begin(), own.end(), id);
}

}  // namespace

ViewSync SyncView(const KindView& from, const std::vector<std::string>& own,
                  KindView* to, const std::vector<std::string>* changed) {
  ViewSync out;
  if (changed != nullptr) {
    for (const std::string& id : *changed) {
      const bool in_from =
          std::binary_search(from.members.begin(), from.members.end(), id);
      auto pos = std::lower_bound(to->members.begin(), to->members.end(), id);
      const bool in_to = pos != to->members.end() && *pos == id;
      if (in_from && !in_to) {
        to->members.insert(pos, id);
        out.joined = true;
      } else if (!in_from && in_to) {
        to->members.erase(pos);
        out.left = true;
      }
      if (IsOwn(own, id)) continue;
      auto f = from.held.find(id);
      auto t = to->held.find(id);
      if (f == from.held.end()) {
        if (t != to->held.end()) {
          to->held.erase(t);
          out.held_changed = true;
        }
      } else if (t == to->held.end()) {
        to->held.emplace(id, f->second);
        out.held_changed = true;
        out.max_token = std::max(out.max_token, f->second.token);
      } else if (!(t->second == f->second)) {
        t->second = f->second;
        out.held_changed = true;
        out.max_token = std::max(out.max_token, f->second.token);
      }
    }
    return out;
  }
  // Members: both sorted; one walk finds who came and who went.
  auto f = from.members.cbegin();
  auto t = to->members.cbegin();
  while ((f != from.members.cend() || t != to->members.cend()) &&
         !(out.joined && out.left)) {
    if (t == to->members.cend() || (f != from.members.cend() && *f < *t)) {
      out.joined = true;
      ++f;
    } else if (f == from.members.cend() || *t < *f) {
      out.left = true;
      ++t;
    } else {
      ++f;
      ++t;
    }
  }
  if (out.joined || out.left) to->members = from.members;
  // Records: both maps are sorted by id; write only what differs, and never
  // the records of our own ids.
  auto fh = from.held.begin();
  auto th = to->held.begin();
  while (fh != from.held.end() || th != to->held.end()) {
    if (th == to->held.end() ||
        (fh != from.held.end() && fh->first < th->first)) {
      if (!IsOwn(own, fh->first)) {
        to->held.emplace_hint(th, fh->first, fh->second);
        out.held_changed = true;
        out.max_token = std::max(out.max_token, fh->second.token);
      }
      ++fh;
    } else if (fh == from.held.end() || th->first < fh->first) {
      if (IsOwn(own, th->first)) {
        ++th;
      } else {
        th = to->held.erase(th);
        out.held_changed = true;
      }
    } else {
      if (!IsOwn(own, th->first) && !(th->second == fh->second)) {
        th->second = fh->second;
        out.held_changed = true;
        out.max_token = std::max(out.max_token, fh->second.token);
      }
      ++fh;
      ++th;
    }
  }
  return out;
}

}  // namespace setpoint
