// minimal_server: the smallest server to copy from. One Beast route, POST /classify
// {"text": "..."}, through one tailbatch Pipeline: the connection submits with its
// arrival time and a callback, never waits on a future, and maps the outcome to an HTTP
// status (tailbatch/serving.hpp). tailbatch-serve (examples/server/) adds the rest:
// limits, streaming, the OpenAI API, metrics, draining. docs/serving.md explains each step.
//
//   minimal_server [PORT]
//   curl -s localhost:PORT/classify -H 'Content-Type: application/json' -d '{"text": "a great
//   film"}'
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/serving.hpp>
#include <thread>
#include <utility>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

// The model behind a batching Pipeline: up to 32 texts per batch, waiting at most 2 ms.
using Prediction = tailbatch::reference::Prediction;
using ClassifyPipeline = tailbatch::Pipeline<std::string, Prediction>;

// One connection: read a request, submit, write the answer when the callback posts it back.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ClassifyPipeline& pipeline)
      : stream_(std::move(socket)), pipeline_(pipeline) {}
  void start() { read(); }

 private:
  void read() {
    req_ = {};
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, req_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec) return self->close();
                       self->handle();
                     });
  }

  void handle() {
    // The request's arrival: queue wait and deadlines count from here, not from submit.
    const auto arrival = std::chrono::steady_clock::now();
    if (req_.target() != "/classify")
      return respond(http::status::not_found, R"({"error":"no such route"})");
    if (req_.method() != http::verb::post)
      return respond(http::status::method_not_allowed, R"({"error":"use POST"})");
    const json body = json::parse(req_.body(), nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("text") || !body["text"].is_string()) {
      return respond(http::status::bad_request, R"({"error":"send {\"text\": \"...\"}"})");
    }
    tailbatch::SubmitOptions options;
    options.arrival = arrival;
    options.timeout = std::chrono::seconds(2);  // the latest start: 2 s after arrival
    // The callback runs on a Pipeline worker: it only posts the outcome back to this
    // connection's strand. No thread waits for the result.
    pipeline_.submit(
        body["text"].get<std::string>(), options,
        [self = shared_from_this()](tailbatch::Outcome<Prediction>&& outcome) {
          asio::post(self->stream_.get_executor(),
                     [self, o = std::move(outcome)]() mutable { self->answer(std::move(o)); });
        });
  }

  void answer(tailbatch::Outcome<Prediction>&& o) {
    if (!o.ok()) {
      // The status mapping: rejected -> 503 (with Retry-After), deadline_exceeded -> 504, ...
      const tailbatch::Error& e = o.error();
      const auto retry = tailbatch::retry_after_seconds(e.retry_after);
      json j = {{"error", {{"status", tailbatch::to_string(e.status)}, {"message", e.message}}}};
      return respond(static_cast<http::status>(tailbatch::http_status(e)), j.dump(), retry);
    }
    const Prediction& p = o.value();
    respond(http::status::ok,
            json{{"label", tailbatch::reference::to_string(p.label)}, {"score", p.confidence()}}
                .dump());
  }

  void respond(http::status status, std::string body, std::uint64_t retry_after_s = 0) {
    res_ = {status, req_.version()};
    res_.set(http::field::content_type, "application/json");
    if (retry_after_s > 0) res_.set(http::field::retry_after, std::to_string(retry_after_s));
    res_.keep_alive(req_.keep_alive());
    res_.body() = std::move(body);
    res_.prepare_payload();
    http::async_write(stream_, res_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec || !self->res_.keep_alive()) return self->close();
                        self->read();
                      });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  beast::tcp_stream stream_;
  ClassifyPipeline& pipeline_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

void accept(tcp::acceptor& acceptor, ClassifyPipeline& pipeline) {
  acceptor.async_accept(
      asio::make_strand(acceptor.get_executor()), [&](beast::error_code ec, tcp::socket socket) {
        if (!ec) {
          socket.set_option(tcp::no_delay(true));  // no Nagle stalls on small responses
          std::make_shared<Session>(std::move(socket), pipeline)->start();
        }
        accept(acceptor, pipeline);
      });
}

int main(int argc, char** argv) {
  const auto port = static_cast<unsigned short>(argc > 1 ? std::atoi(argv[1]) : 8080);
  const tailbatch::reference::Classifier classifier;
  tailbatch::reference::ClassifierModel model(classifier);
  ClassifyPipeline pipeline([&](std::span<const std::string> texts, std::span<Prediction> out,
                                tailbatch::HostLanes::Lane& lane) { model(texts, out, lane); },
                            tailbatch::FixedWindow(32, std::chrono::milliseconds(2)));
  asio::io_context ioc;
  tcp::acceptor acceptor(ioc, {asio::ip::make_address("127.0.0.1"), port});
  std::printf("listening on 127.0.0.1:%u\n",
              static_cast<unsigned>(acceptor.local_endpoint().port()));
  std::fflush(stdout);
  accept(acceptor, pipeline);
  ioc.run();  // one I/O thread; the Pipeline owns its worker
}
