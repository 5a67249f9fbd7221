// The desired state: a YAML catalog of rrsets, read again on every list,
// so an edited file takes effect within the source's interval.
//
//   ttl: 300                      # the default for every rrset
//   records:
//     www: 192.0.2.10             # an A rrset of one address
//     api: [192.0.2.11, 192.0.2.12]
//     mail: {type: MX, ttl: 60, content: ["10 mx.example.org."]}
//
// Names are relative to the zone ("@" is the zone itself) or absolute
// (with the trailing dot).
#ifndef SETPOINT_EXAMPLES_POWERDNS_CATALOG_H_
#define SETPOINT_EXAMPLES_POWERDNS_CATALOG_H_

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "zone_api.h"

namespace powerdns {

// The catalog at `path` as rrsets of `zone`; a clear error (the file, the
// name) for a file that does not parse, an unknown type or no content.
inline absl::StatusOr<Rrsets> ReadCatalog(const std::string& path,
                                          const std::string& zone) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  Rrsets out;
  try {
    const uint32_t ttl = root["ttl"] ? root["ttl"].as<uint32_t>() : 300;
    for (const auto& entry : root["records"]) {
      const std::string rel = entry.first.as<std::string>();
      std::string name = rel == "@" ? zone
                         : absl::EndsWith(rel, ".")
                             ? rel
                             : absl::StrCat(rel, ".", zone);
      const YAML::Node& v = entry.second;
      std::string type =
          v.IsMap() && v["type"] ? v["type"].as<std::string>() : "A";
      if (!Managed(type)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", rel, ": type ", type, " is not managed"));
      }
      Rrset r;
      r.ttl = v.IsMap() && v["ttl"] ? v["ttl"].as<uint32_t>() : ttl;
      const YAML::Node& content = v.IsMap() ? v["content"] : v;
      if (content.IsScalar()) r.contents.push_back(content.as<std::string>());
      if (content.IsSequence())
        r.contents = content.as<std::vector<std::string>>();
      if (r.contents.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", rel, ": no content"));
      }
      std::sort(r.contents.begin(), r.contents.end());
      out[absl::StrCat(name, " ", type)] = std::move(r);
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return out;
}

}  // namespace powerdns

#endif  // SETPOINT_EXAMPLES_POWERDNS_CATALOG_H_
