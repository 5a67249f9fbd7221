// The sharded example's controller: every record of the catalog exists on
// the DNS API with the wanted address, and the leader keeps the zone's
// serial equal to the number of records. Each write carries its node's
// fencing token (the API checks it).
#ifndef SETPOINT_EXAMPLES_SHARDED_RECORDS_CONTROLLER_H_
#define SETPOINT_EXAMPLES_SHARDED_RECORDS_CONTROLLER_H_

#include <memory>
#include <string>

#include "records_api.h"
#include "setpoint/controller/controller.h"
#include "setpoint/planner/plan.h"

namespace sharded {

using setpoint::Context;

// How the Syncer changes the world: one API call per operation.
class RecordClient
    : public setpoint::SyncerClient<std::string, Record, Record> {
 public:
  explicit RecordClient(RecordsApi* api) : api_(api) {}
  absl::Status Create(const Context& ctx, const std::string& name,
                      const Record& want) override {
    return api_->Put(ctx, name, want);
  }
  absl::Status Update(const Context& ctx, const std::string& name,
                      const Record& want, const Record&) override {
    return api_->Put(ctx, name, want);
  }
  absl::Status Delete(const Context& ctx, const std::string& name,
                      const Record&) override {
    return api_->Delete(ctx, name);
  }

 private:
  RecordsApi* api_;
};

// Nodes of kind "records" split the ring; each syncs the records of its
// shards from the catalog (desired) to the API (observed). The API's list
// is shared by the pod's nodes: one list of the zone per interval per pod.
inline setpoint::ControllerKind RecordsKind(RecordsApi* api, Catalog* catalog,
                                            RecordClient* client) {
  return {.kind = "records",
          .count = 2,
          .build = [=](setpoint::ControllerBuilder& b) {
            auto* seen = b.SharedPoll<std::string, Record>(
                "seen", [api](const Context& ctx) { return api->List(ctx); },
                {.interval = absl::Milliseconds(500)});
            auto* want = b.Poll<std::string, Record>(
                "want", [catalog](const Context&) { return catalog->Get(); },
                {.interval = absl::Milliseconds(500)});
            b.Sync("records", client, seen, want,
                   setpoint::SyncerOptions<Record, Record>{.max_in_flight = 8});
            return absl::OkStatus();
          }};
}

// One node of the fleet at a time publishes the zone's serial.
inline setpoint::ControllerKind ZoneKind(RecordsApi* api) {
  return setpoint::LeaderKind("zone", [api](setpoint::ControllerBuilder& b) {
    b.Reconcile(
        setpoint::MakePlan(
            "zone serial",
            [api](const Context& ctx) -> absl::StatusOr<setpoint::Procedures> {
              SETPOINT_ASSIGN_OR_RETURN(Records now, api->List(ctx));
              auto n = static_cast<int64_t>(now.size());
              if (api->serial() == n) return setpoint::Procedures{};
              return setpoint::ProcedureList(setpoint::MakeProcedure(
                  "publish serial",
                  [api, n](const Context& step)
                      -> absl::StatusOr<setpoint::Procedures> {
                    SETPOINT_RETURN_IF_ERROR(api->PublishSerial(step, n));
                    return setpoint::Procedures{};
                  }));
            }),
        {.interval = absl::Milliseconds(500)});
    return absl::OkStatus();
  });
}

}  // namespace sharded

#endif  // SETPOINT_EXAMPLES_SHARDED_RECORDS_CONTROLLER_H_
