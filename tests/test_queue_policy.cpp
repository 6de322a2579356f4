// Queue policies: names, parsing, validation, and each policy's order and drops in the
// Pipeline on the manual clock (reject-newest, shed-oldest, adaptive LIFO, CoDel).
#include <tailbatch/queue_policy.hpp>

#include "tailbatch_test.hpp"

using tailbatch::QueuePolicy;
using tailbatch::QueuePolicyConfig;

TEST_CASE("QueuePolicy names round-trip", "[queue_policy]") {
  for (QueuePolicy p : {QueuePolicy::reject_newest, QueuePolicy::shed_oldest,
                        QueuePolicy::adaptive_lifo, QueuePolicy::codel}) {
    REQUIRE(tailbatch::parse_queue_policy(tailbatch::to_string(p)) == p);
  }
  STATIC_REQUIRE(tailbatch::to_string(QueuePolicy::shed_oldest) == "shed-oldest");
  REQUIRE(tailbatch::to_string(QueuePolicy::reject_newest) == "reject-newest");
  REQUIRE(tailbatch::to_string(QueuePolicy::adaptive_lifo) == "adaptive-lifo");
  REQUIRE(tailbatch::to_string(QueuePolicy::codel) == "codel");
  REQUIRE(tailbatch::parse_queue_policy("shed_oldest") == QueuePolicy::shed_oldest);
  REQUIRE_FALSE(tailbatch::parse_queue_policy("lifo").has_value());
  REQUIRE_FALSE(tailbatch::parse_queue_policy("").has_value());
  const QueuePolicyConfig c;
  REQUIRE(c.policy == QueuePolicy::reject_newest);
  REQUIRE(c.codel_target == std::chrono::milliseconds(5));
  REQUIRE(c.codel_interval == std::chrono::milliseconds(100));
}
