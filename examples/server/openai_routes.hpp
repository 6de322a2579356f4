// tailbatch-serve, the OpenAI routes: /v1/models, /v1/completions, /v1/chat/completions,
// /v1/embeddings (openai_routes.hpp). One of the parts tailbatch_serve.cpp includes, in this order:
// options.hpp, server.hpp, connection.hpp, models.hpp, classic_routes.hpp, openai_routes.hpp; not a
// header to include elsewhere.
#pragma once

namespace tailbatch_serve {

void Server::models(const std::shared_ptr<Connection>& c) {
  json data = json::array();
  for (std::string_view id : {generator_model_id, embed_model_id_}) {
    data.push_back(
        {{"id", id}, {"object", "model"}, {"created", created_}, {"owned_by", "tailbatch"}});
  }
  c->respond(200, dump(json{{"object", "list"}, {"data", std::move(data)}}));
}

// An OpenAI request decoded for the model `model_id`: records its user for the log and
// returns true; else answers the decoding error, or 404 for another model, and returns false.
template <class Request>
bool accept_openai(Connection& c, const std::optional<Request>& decoded, const ApiError& err,
                   std::string_view model_id, std::string_view what) {
  if (!decoded) {
    c.respond_api_error(err);
    return false;
  }
  c.context().user = tailbatch_serve::loggable(decoded->user);
  if (decoded->model != model_id) {
    c.respond_api_error(model_not_found(decoded->model, what));
    return false;
  }
  return true;
}

void Server::completions(const std::shared_ptr<Connection>& c,
                         const http::request<http::string_body>& req, bool chat) {
  ApiError err;
  auto decoded = tailbatch_serve::decode_completion(req.body(), chat, limits_, oai_limits_, err);
  if (!accept_openai(*c, decoded, err, generator_model_id, "generate text")) return;
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  Batcher::Request r;
  vocab_.encode(decoded->prompt, r.prompt);
  if (r.prompt.size() > opt_.gen_max_prompt_tokens) {
    return c->respond_api_error(
        ApiError{400,
                 "the prompt has " + std::to_string(r.prompt.size()) + " tokens; at most " +
                     std::to_string(opt_.gen_max_prompt_tokens) + " are served",
                 chat ? "messages" : "prompt", "context_length_exceeded"});
  }
  auto job = std::make_shared<Connection::GenerateJob>();
  job->conn = c;
  job->openai = true;
  job->chat = chat;
  job->stream = decoded->stream;
  job->include_usage = decoded->include_usage;
  job->id = (chat ? "chatcmpl-" : "cmpl-") + c->context().request_id;
  job->model = decoded->model;
  job->created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  job->prompt_tokens = r.prompt.size();
  job->max_tokens = decoded->max_tokens;
  job->stop = ref::StopMatcher(decoded->stop);
  const std::uint64_t seed =
      decoded->seed ? static_cast<std::uint64_t>(*decoded->seed)
                    : next_seed_.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ULL;
  r.max_new_tokens = decoded->max_tokens;
  r.state = text_generator_.new_state({decoded->temperature, decoded->top_p}, seed, decoded->stop);
  r.completion_deadline = completion_deadline_of(req, c->context().arrival);
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;
  so.tenant = tenant_of(c, req, decoded->user);
  tb::StreamCallbacks<std::int32_t> cb;
  cb.on_tokens = [job, ttft = ttft_,
                  arrival = c->context().arrival](std::span<const std::int32_t> t) {
    std::lock_guard lock(job->mu);
    const bool first = !job->any_tokens;
    if (first) ttft->record(std::chrono::steady_clock::now() - arrival);
    job->any_tokens = true;
    std::string released;
    for (std::int32_t id : t) {
      ++job->completion_tokens;
      job->piece.clear();
      ref::TextVocabulary::append_piece(id, job->piece);
      released += job->stop.push(job->piece);
    }
    if (!job->stream) {
      job->text += released;
      return;  // one flush, at the end
    }
    if (first && job->chat) {
      Connection::append_event(job->outbox, Connection::chunk_json(*job, "", true, std::nullopt));
    }
    if (!released.empty())
      Connection::append_event(job->outbox,
                               Connection::chunk_json(*job, released, false, std::nullopt));
    post_flush(job);
  };
  cb.on_end = [job](const tb::StreamEnd& e) {
    std::lock_guard lock(job->mu);
    job->end = e;
    const std::string rest = job->stop.finish();
    if (!job->stream) {
      job->text += rest;
    } else if (job->any_tokens || e.ok()) {
      if (!job->any_tokens && job->chat) {
        Connection::append_event(job->outbox, Connection::chunk_json(*job, "", true, std::nullopt));
      }
      if (e.ok()) {
        Connection::append_event(
            job->outbox,
            Connection::chunk_json(*job, rest, false, Connection::finish_reason(*job)));
        if (job->include_usage) {
          json u = Connection::chunk_json(*job, "", false, std::nullopt);
          u["choices"] = json::array();
          u["usage"] = Connection::usage_json(*job);
          Connection::append_event(job->outbox, u);
        }
      } else {
        // A failure after the stream started: in band, then the end.
        if (!rest.empty())
          Connection::append_event(job->outbox,
                                   Connection::chunk_json(*job, rest, false, std::nullopt));
        Connection::append_event(job->outbox,
                                 Connection::outcome_error_json(Connection::error_of(e)));
      }
      job->outbox += "data: [DONE]\n\n";
    }
    post_flush(job);
  };
  submit_generate(*batcher_, c, job, std::move(r), so, std::move(cb));
}

void Server::embeddings(const std::shared_ptr<Connection>& c,
                        const http::request<http::string_body>& req) {
  const std::size_t dim = embed_dim_;
  ApiError err;
  auto decoded = tailbatch_serve::decode_embeddings(req.body(), limits_, oai_limits_, dim, err);
  if (!accept_openai(*c, decoded, err, embed_model_id_, "embed")) return;
  const std::size_t limit = embed_max_tokens_;
  std::size_t prompt_tokens = 0;
  std::vector<std::uint32_t> ids;
  for (std::size_t i = 0; i < decoded->inputs.size(); ++i) {
    ids.clear();
    if (embed_counter_) {
      embed_counter_->tokenize(decoded->inputs[i], ids);
    } else {
      classifier_.tokenizer().tokenize(decoded->inputs[i], ids);
    }
    if (ids.size() > limit) {
      return c->respond_api_error(ApiError{400,
                                           "input " + std::to_string(i) + " has more than " +
                                               std::to_string(limit) +
                                               " tokens, the embedder's limit",
                                           "input", "context_length_exceeded"});
    }
    prompt_tokens += ids.size();
  }
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  struct EmbedJob {
    std::shared_ptr<Connection> conn;
    std::vector<std::optional<tb::Outcome<std::vector<float>>>> outcomes;
    std::atomic<std::size_t> remaining{0};
    tb::CancellationSource cancel;
    bool base64 = false;
    std::size_t prompt_tokens = 0;
    std::string model;
  };
  auto job = std::make_shared<EmbedJob>();
  const std::size_t n = decoded->inputs.size();
  job->conn = c;
  job->outcomes.resize(n);
  job->remaining.store(n, std::memory_order_relaxed);
  job->base64 = decoded->base64;
  job->prompt_tokens = prompt_tokens;
  job->model = decoded->model;
  // The Connection watches for a disconnect through a classify job's cancel source; an
  // embeddings request shares that path with an empty ClassifyJob holding the same source.
  auto watch = std::make_shared<Connection::ClassifyJob>();
  watch->conn = c;
  job->cancel = watch->cancel;
  c->set_classify_job(watch);
  c->work_started();
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;
  so.cancel = job->cancel.get_token();
  so.tenant = tenant_of(c, req, decoded->user);
  // Each input is one request; the last outcome in answers the whole.
  auto deliver = [](const std::shared_ptr<EmbedJob>& job, std::size_t i,
                    tb::Outcome<std::vector<float>>&& o) {
    job->outcomes[i].emplace(std::move(o));
    if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    auto conn = job->conn;
    asio::post(conn->executor(), [conn, job] {
      json data = json::array();
      for (std::size_t k = 0; k < job->outcomes.size(); ++k) {
        auto& out = *job->outcomes[k];
        if (!out.ok())
          return conn->finish_custom(
              [e = out.error()](Connection& cc) { cc.respond_outcome_error(e); });
        json item = {{"object", "embedding"}, {"index", k}};
        const std::vector<float>& v = out.value();
        if (job->base64) {
          item["embedding"] = tailbatch_serve::base64(
              std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
        } else {
          item["embedding"] = v;
        }
        data.push_back(std::move(item));
      }
      json body = {
          {"object", "list"},
          {"data", std::move(data)},
          {"model", job->model},
          {"usage", {{"prompt_tokens", job->prompt_tokens}, {"total_tokens", job->prompt_tokens}}}};
      conn->finish_custom(
          [b = dump(body)](Connection& cc) mutable { cc.respond(200, std::move(b)); });
    });
  };
  for (std::size_t i = 0; i < n; ++i) {
#ifdef TAILBATCH_SERVE_LIBTORCH
    if (torch_embed_) {
      torch_embed_->submit((*torch_tokenizer_)(decoded->inputs[i], i), so,
                           [job, i, deliver](tb::Outcome<tailbatch_libtorch::Encoding>&& o) {
                             if (o.ok()) {
                               deliver(job, i, std::move(o.value().embedding));
                             } else {
                               deliver(job, i, o.error());
                             }
                           });
      continue;
    }
#endif
    embed_pipeline_->submit(
        std::move(decoded->inputs[i]), so,
        [job, i, deliver](tb::Outcome<std::vector<float>>&& o) { deliver(job, i, std::move(o)); });
  }
}

}  // namespace tailbatch_serve
