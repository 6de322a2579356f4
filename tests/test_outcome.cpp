// Outcomes: statuses, reasons, value access and the cancellation aliases.
#include <tailbatch/outcome.hpp>

#include <cstdint>
#include <string>

#include "tailbatch_test.hpp"

using tailbatch::BadOutcomeAccess;
using tailbatch::Error;
using tailbatch::Outcome;
using tailbatch::RejectReason;
using tailbatch::Status;

TEST_CASE("An ok outcome holds its value", "[outcome]") {
  Outcome<std::string> o(std::string("positive"));
  REQUIRE(o.ok());
  REQUIRE(static_cast<bool>(o));
  REQUIRE(o.status() == Status::ok);
  REQUIRE(o.reason() == RejectReason::none);
  REQUIRE(o.message().empty());
  REQUIRE(o.value() == "positive");
  std::string moved = std::move(o).value();
  REQUIRE(moved == "positive");
}

TEST_CASE("A failed outcome carries its error and refuses value()", "[outcome]") {
  Outcome<int> o(Error{Status::rejected, RejectReason::queue_full, "queue full (1024)",
                       std::chrono::milliseconds(3)});
  REQUIRE_FALSE(o.ok());
  REQUIRE(o.status() == Status::rejected);
  REQUIRE(o.reason() == RejectReason::queue_full);
  REQUIRE(o.message() == "queue full (1024)");
  REQUIRE(o.retry_after() == std::chrono::milliseconds(3));
  REQUIRE(o.error().message == "queue full (1024)");
  try {
    (void)o.value();
    FAIL("value() did not throw");
  } catch (const BadOutcomeAccess& e) {
    REQUIRE(e.error().status == Status::rejected);
    REQUIRE(std::string(e.what()).find("rejected") != std::string::npos);
    REQUIRE(std::string(e.what()).find("queue full (1024)") != std::string::npos);
  }
}

TEST_CASE("Statuses and reasons have stable names", "[outcome]") {
  STATIC_REQUIRE(tailbatch::to_string(Status::deadline_exceeded) == "deadline_exceeded");
  REQUIRE(tailbatch::to_string(Status::ok) == "ok");
  REQUIRE(tailbatch::to_string(Status::rejected) == "rejected");
  REQUIRE(tailbatch::to_string(Status::cancelled) == "cancelled");
  REQUIRE(tailbatch::to_string(Status::failed) == "failed");
  REQUIRE(tailbatch::to_string(RejectReason::queue_full) == "queue_full");
  REQUIRE(tailbatch::to_string(RejectReason::overloaded) == "overloaded");
  REQUIRE(tailbatch::to_string(RejectReason::shutting_down) == "shutting_down");
  REQUIRE(tailbatch::to_string(RejectReason::too_large) == "too_large");
  REQUIRE(tailbatch::to_string(RejectReason::quota_exceeded) == "quota_exceeded");
  REQUIRE(tailbatch::to_string(RejectReason::shed) == "shed");
  for (std::size_t i = 0; i < tailbatch::reject_reason_count; ++i) {
    REQUIRE(tailbatch::to_string(static_cast<RejectReason>(i)) != "unknown");
  }
  REQUIRE(tailbatch::to_string(static_cast<RejectReason>(tailbatch::reject_reason_count)) == "unknown");
  STATIC_REQUIRE(tailbatch::OutcomeCounts{}.rejected_by_reason.size() == tailbatch::reject_reason_count);
}

TEST_CASE("enum_name reads an enumerator's name from its list, and `other` past it", "[outcome]") {
  enum class Colour : std::uint8_t { red, green };
  using tailbatch::detail::enum_name;
  STATIC_REQUIRE(enum_name<2>(Colour::green, {"red", "green"}) == "green");
  REQUIRE(enum_name(Colour::red, {"red", "green"}) == "red");
  REQUIRE(enum_name(static_cast<Colour>(2), {"red", "green"}) == "unknown");
  REQUIRE(enum_name(static_cast<Colour>(9), {"red", "green"}, {}).empty());
  REQUIRE(tailbatch::to_string(static_cast<Status>(tailbatch::status_count)) == "unknown");
}

TEST_CASE("Cancellation tokens observe their source and run callbacks once", "[outcome]") {
  tailbatch::CancellationSource source;
  tailbatch::CancellationToken token = source.get_token();
  int calls = 0;
  {
    auto on_cancel = [&] { ++calls; };
    tailbatch::CancellationCallback<decltype(on_cancel)> cb(token, on_cancel);
    REQUIRE_FALSE(token.stop_requested());
    REQUIRE(source.request_stop());
    REQUIRE_FALSE(source.request_stop());
  }
  REQUIRE(token.stop_requested());
  REQUIRE(calls == 1);

  tailbatch::CancellationToken none;  // default: can never be cancelled, allocates nothing
  REQUIRE_FALSE(none.stop_possible());
}
