// comm.cpp — Comm's backends (solo, and any c10d ProcessGroup) and the collective counters.
#include "meshtrain/runtime/comm.hpp"
#include "meshtrain/runtime/local_group.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <type_traits>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace meshtrain::runtime {

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::allreduce: return "allreduce";
    case Collective::allgather: return "allgather";
    case Collective::broadcast: return "broadcast";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_to_all: return "all_to_all";
    case Collective::barrier: return "barrier";
    case Collective::point_to_point: return "point_to_point";
    case Collective::kv_exchange: return "kv_exchange";
    case Collective::stage_transfer: return "stage_transfer";
  }
  return "?";
}

int64_t CollectiveCounters::begin(const std::string& group, Collective kind, int64_t sequence, int64_t bytes) {
  std::lock_guard<std::mutex> lock(recent_mutex_);
  const int64_t ticket = next_ticket_++;
  recent_.emplace_back(ticket, CollectiveEntry{group, kind, sequence, bytes, std::chrono::steady_clock::now(), false});
  if (recent_.size() > kRecentCollectives) recent_.pop_front();
  return ticket;
}

void CollectiveCounters::finish(int64_t ticket, Collective kind, int64_t bytes, double seconds) {
  {
    std::lock_guard<std::mutex> lock(recent_mutex_);
    for (auto& [t, entry] : recent_)
      if (t == ticket) entry.completed = true;
  }
  record(kind, bytes, seconds);
}

void CollectiveCounters::record(Collective kind, int64_t bytes, double seconds) {
  calls_[static_cast<int>(kind)].fetch_add(1);
  bytes_[static_cast<int>(kind)].fetch_add(bytes);
  nanoseconds_.fetch_add(static_cast<int64_t>(seconds * 1e9));
  nanoseconds_by_kind_[static_cast<int>(kind)].fetch_add(static_cast<int64_t>(seconds * 1e9));
}

std::vector<CollectiveEntry> CollectiveCounters::recent() const {
  std::lock_guard<std::mutex> lock(recent_mutex_);
  std::vector<CollectiveEntry> out;
  for (const auto& [ticket, entry] : recent_) out.push_back(entry);
  return out;
}

std::vector<std::string> CollectiveCounters::recent_lines() const {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> lines;
  for (const CollectiveEntry& e : recent()) {
    const double age = std::chrono::duration<double>(now - e.started).count();
    lines.push_back(fmt::format("{} #{} {} {} B: {}", e.group, e.sequence, collective_name(e.kind), e.bytes,
                                e.completed ? fmt::format("completed (entered {:.1f} s ago)", age)
                                            : fmt::format("NOT completed, waiting for {:.1f} s", age)));
  }
  return lines;
}

int64_t CollectiveCounters::total_calls() const {
  int64_t n = 0;
  for (const auto& c : calls_) n += c.load();
  return n;
}

int64_t CollectiveCounters::total_bytes() const {
  int64_t n = 0;
  for (const auto& b : bytes_) n += b.load();
  return n;
}

std::string CollectiveCounters::summary() const {
  std::string out;
  for (int k = 0; k < kNumCollectives; ++k) {
    int64_t calls = calls_[k].load();
    if (calls == 0) continue;
    out += fmt::format("{}{} {} call{} {} B", out.empty() ? "" : ", ", collective_name(static_cast<Collective>(k)),
                       calls, calls == 1 ? "" : "s", bytes_[k].load());
  }
  return out.empty() ? "none" : out;
}

// The operations a Comm forwards to; inputs are validated by Comm.
class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduce_sum(at::Tensor& tensor) = 0;
  // Starts an all-gather into the tensor `into` makes ([size * n, ...], local's dtype, contiguous), called when the
  // transport first writes to it; the returned function waits for it and returns that tensor.
  virtual std::function<at::Tensor()> start_allgather(const at::Tensor& local,
                                                      const std::function<at::Tensor()>& into) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  // Starts an all-to-all of `input` ([size * n, ...]); the returned function waits for it and returns what arrived.
  virtual std::function<at::Tensor()> start_all_to_all(const at::Tensor& input) = 0;
  // Starts a reduce-scatter of `input` ([size * n, ...], unchanged until the wait); the returned function waits for it
  // and returns this rank's chunk of the sum, the chunks added in rank order. By default an all-to-all (Gloo in 1.13
  // has no reduce-scatter): chunk r of every rank arrives at rank r and is summed here.
  virtual std::function<at::Tensor()> start_reduce_scatter_sum(const at::Tensor& input) {
    std::function<at::Tensor()> receive = start_all_to_all(input);
    return [receive, n = size()] {
      std::vector<at::Tensor> chunks = receive().chunk(n, 0);
      at::Tensor sum = chunks[0].clone();
      for (int r = 1; r < n; ++r) sum.add_(chunks[r]);
      return sum;
    };
  }
  virtual void barrier() = 0;
  // Starts the point-to-point sends and receives: `wait` waits for all of them (and returns an undefined tensor),
  // `done` says whether they have completed, without waiting.
  struct StartedExchange {
    std::function<at::Tensor()> wait;
    std::function<bool()> done;
  };
  virtual StartedExchange start_exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                                         const std::vector<std::pair<int, at::Tensor>>& receives, int tag) = 0;
};

namespace {

class SoloBackend final : public CommBackend {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(at::Tensor&) override {}
  std::function<at::Tensor()> start_allgather(const at::Tensor& local,
                                              const std::function<at::Tensor()>& into) override {
    at::Tensor gathered = into();
    gathered.copy_(local);
    return [gathered] { return gathered; };
  }
  void broadcast(at::Tensor&, int) override {}
  std::function<at::Tensor()> start_all_to_all(const at::Tensor& input) override {
    at::Tensor received = input.clone();
    return [received] { return received; };
  }
  void barrier() override {}
  StartedExchange start_exchange(const std::vector<std::pair<int, at::Tensor>>&,
                                 const std::vector<std::pair<int, at::Tensor>>&, int) override {
    MT_CHECK(false, "a group of one device has no peer to exchange with");
  }
};

// Gloo in libtorch 1.13 has no bf16/fp16 reductions: those travel as fp32 and are cast back (gathers move the bits).
bool needs_fp32_transport(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// Starts a c10d all-gather of `local` into `into` (contiguous, [size * n, ...]: each rank's part lands in its chunk,
// no concatenation afterwards). A gather adds nothing up: 16-bit floats travel as their bits (Gloo has fp16, not
// bf16: bf16 as an fp16 view).
c10::intrusive_ptr<c10d::Work> issue_allgather(C10dGroup& group, const at::Tensor& local, const at::Tensor& into) {
  auto as_carried = [](const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t; };
  std::vector<at::Tensor> inputs{as_carried(local.contiguous())};
  std::vector<std::vector<at::Tensor>> outputs{as_carried(into).chunk(group.getSize(), 0)};
  return group.allgather(outputs, inputs);  // the work keeps its tensors until it ends
}

class ProcessGroupBackend final : public CommBackend {
 public:
  explicit ProcessGroupBackend(c10::intrusive_ptr<C10dGroup> group) : group_(std::move(group)) {}
  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }

  void allreduce_sum(at::Tensor& tensor) override {
    std::vector<at::Tensor> buffers{needs_fp32_transport(tensor) ? tensor.to(at::kFloat) : tensor};
    group_->allreduce(buffers)->wait();
    if (!buffers[0].is_same(tensor)) tensor.copy_(buffers[0]);
  }

  std::function<at::Tensor()> start_allgather(const at::Tensor& local,
                                              const std::function<at::Tensor()>& make_into) override {
    const at::Tensor into = make_into();  // Gloo writes from now on
    auto work = issue_allgather(*group_, local, into);
    return [work, into] {
      work->wait();
      return into;
    };
  }

  void broadcast(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> buffers{needs_fp32_transport(tensor) ? tensor.to(at::kFloat) : tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group_->broadcast(buffers, options)->wait();
    if (!buffers[0].is_same(tensor)) tensor.copy_(buffers[0]);
  }

  std::function<at::Tensor()> start_all_to_all(const at::Tensor& input) override {
    at::Tensor send = needs_fp32_transport(input) ? input.to(at::kFloat) : input.contiguous();
    at::Tensor received = at::empty_like(send);
    std::vector<int64_t> equal_splits;  // empty: equal chunks along dim 0
    auto work = group_->alltoall_base(received, send, equal_splits, equal_splits);
    return [work, send, received, dtype = input.scalar_type()] {
      work->wait();
      return received.to(dtype);
    };
  }

  void barrier() override { group_->barrier()->wait(); }

  StartedExchange start_exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                                 const std::vector<std::pair<int, at::Tensor>>& receives, int tag) override {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    // c10d takes the tensor vectors by reference and keeps them until the work ends: they live until the waits.
    auto buffers = std::make_shared<std::vector<std::vector<at::Tensor>>>();
    buffers->reserve(sends.size() + receives.size());
    for (const auto& [rank, tensor] : sends) {
      buffers->push_back({tensor});
      works.push_back(group_->send(buffers->back(), rank, tag));
    }
    for (const auto& [rank, tensor] : receives) {
      buffers->push_back({tensor});
      works.push_back(group_->recv(buffers->back(), rank, tag));
    }
    auto wait = [works, buffers] {
      for (const auto& work : works) work->wait();
      return at::Tensor();
    };
    auto done = [works] {
      return std::all_of(works.begin(), works.end(), [](const auto& work) { return work->isCompleted(); });
    };
    return {wait, done};
  }

 private:
  c10::intrusive_ptr<C10dGroup> group_;
};

// A group whose members are all device threads of this process (runtime/local_group.hpp): each collective posts a
// private copy of this member's part and reads the others' when waited for. Point-to-point exchanges (the variable
// all-to-all of expert parallelism) go through the group's Gloo backend.
class LocalBackend final : public CommBackend {
 public:
  LocalBackend(std::shared_ptr<LocalGroup> group, int rank, std::unique_ptr<CommBackend> for_exchange)
      : group_(std::move(group)), rank_(rank), for_exchange_(std::move(for_exchange)) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void allreduce_sum(at::Tensor& tensor) override {
    const int64_t sequence = ++sequence_;
    group_->post(sequence, rank_, tensor.clone());
    const std::vector<at::Tensor> parts = group_->read(sequence, rank_);
    // In rank order, so every member computes the same bits; 16-bit floats add up in fp32, as over Gloo.
    at::Tensor sum = needs_fp32_transport(tensor) ? parts[0].to(at::kFloat) : parts[0].clone();
    for (int r = 1; r < size(); ++r) sum.add_(parts[r]);
    tensor.copy_(sum);
  }

  // The destination is made when the parts are read: a gather started early (a prefetch) holds no buffer of the
  // result's size until it is waited for.
  std::function<at::Tensor()> start_allgather(const at::Tensor& local,
                                              const std::function<at::Tensor()>& make_into) override {
    const int64_t sequence = ++sequence_;
    group_->post(sequence, rank_, local.clone(at::MemoryFormat::Contiguous));
    return [this, sequence, make_into] {
      const std::vector<at::Tensor> parts = group_->read(sequence, rank_);
      const at::Tensor into = make_into();
      const std::vector<at::Tensor> chunks = into.chunk(size(), 0);
      for (int r = 0; r < size(); ++r) chunks[r].copy_(parts[r]);
      return into;
    };
  }

  void broadcast(at::Tensor& tensor, int root) override {
    const int64_t sequence = ++sequence_;
    group_->post(sequence, rank_, rank_ == root ? tensor.clone() : at::empty({0}, tensor.options()));
    const std::vector<at::Tensor> parts = group_->read(sequence, rank_);
    if (rank_ != root) tensor.copy_(parts[root]);
  }

  std::function<at::Tensor()> start_all_to_all(const at::Tensor& input) override {
    const int64_t sequence = ++sequence_;
    group_->post(sequence, rank_, input.clone(at::MemoryFormat::Contiguous));
    return [this, sequence, options = input.options(), sizes = input.sizes().vec()] {
      const std::vector<at::Tensor> parts = group_->read(sequence, rank_);
      at::Tensor received = at::empty(sizes, options);
      const std::vector<at::Tensor> chunks = received.chunk(size(), 0);
      for (int r = 0; r < size(); ++r) chunks[r].copy_(parts[r].chunk(size(), 0)[rank_]);
      return received;
    };
  }

  // The members' inputs are summed whole in rank order as they are posted (LocalGroup::post_to_sum, no copy but the
  // sum's): the group holds one sum and the inputs that came early, each member then takes its chunk.
  std::function<at::Tensor()> start_reduce_scatter_sum(const at::Tensor& input) override {
    const int64_t sequence = ++sequence_;
    group_->post_to_sum(sequence, rank_, input.contiguous());
    return [this, sequence] { return group_->read_sum(sequence, rank_).chunk(size(), 0)[rank_].clone(); };
  }

  void barrier() override {
    const int64_t sequence = ++sequence_;
    group_->post(sequence, rank_, at::empty({0}));
    group_->read(sequence, rank_);
  }

  StartedExchange start_exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                                 const std::vector<std::pair<int, at::Tensor>>& receives, int tag) override {
    return for_exchange_->start_exchange(sends, receives, tag);
  }

 private:
  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::unique_ptr<CommBackend> for_exchange_;
  int64_t sequence_ = 0;  // this member's collectives over the group (its device thread only)
};

// A group across hosts with several members on each (HostSplit in comm.hpp). A gather goes first between hosts, each
// member with the members of its on-host index (a Gloo buffer of hosts x its part, not of the whole result), then
// through memory between the members of the host; a reduce-scatter first sums through memory on the host, each
// member taking the chunks of its on-host index, then reduce-scatters those between hosts. The other collectives go
// over the whole group's Gloo backend.
//
// As between local groups, no member waits for another to wait: a gather's part is posted to the host when its
// Gloo gather completes (on Gloo's thread), and a reduce-scatter's sum is read when the collective starts, which each
// member does at the same point of its program.
class HostSplitBackend final : public CommBackend {
 public:
  HostSplitBackend(c10::intrusive_ptr<C10dGroup> whole, HostSplit split)
      : whole_(std::move(whole)),
        on_host_(std::move(split.on_host)),
        on_host_rank_(split.on_host_rank),
        across_hosts_(std::move(split.across_hosts)),
        group_rank_(std::move(split.group_rank)) {
    MT_CHECK(static_cast<int>(group_rank_.size()) == across_hosts_->getSize() &&
                 static_cast<int>(group_rank_[0].size()) == on_host_->size() &&
                 across_hosts_->getSize() * on_host_->size() == whole_.size(),
             "a group of {} split over {} hosts x {} members", whole_.size(), across_hosts_->getSize(),
             on_host_->size());
  }
  int rank() const override { return whole_.rank(); }
  int size() const override { return whole_.size(); }
  void allreduce_sum(at::Tensor& tensor) override { whole_.allreduce_sum(tensor); }
  void broadcast(at::Tensor& tensor, int root) override { whole_.broadcast(tensor, root); }
  std::function<at::Tensor()> start_all_to_all(const at::Tensor& input) override {
    return whole_.start_all_to_all(input);
  }
  void barrier() override { whole_.barrier(); }
  StartedExchange start_exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                                 const std::vector<std::pair<int, at::Tensor>>& receives, int tag) override {
    return whole_.start_exchange(sends, receives, tag);
  }

  std::function<at::Tensor()> start_allgather(const at::Tensor& local,
                                              const std::function<at::Tensor()>& make_into) override {
    const int hosts = across_hosts_->getSize();
    std::vector<int64_t> column_shape = local.sizes().vec();
    column_shape[0] *= hosts;
    // [hosts * n, ...]: the parts of this member's on-host index, host by host.
    const at::Tensor column = at::empty(column_shape, local.options());
    const int64_t sequence = ++on_host_sequence_;  // numbered when started: members may wait in different orders
    auto work = issue_allgather(*across_hosts_, local, column);
    work->getFuture()->addCallback([on_host = on_host_, sequence, rank = on_host_rank_, column](
                                       c10::ivalue::Future& done) {
      if (!done.hasError()) on_host->post(sequence, rank, column);  // a failure is rethrown by the wait below
    });
    return [this, work, sequence, make_into, hosts] {
      work->wait();
      const std::vector<at::Tensor> columns = on_host_->read(sequence, on_host_rank_);
      const at::Tensor into = make_into();
      const std::vector<at::Tensor> chunks = into.chunk(size(), 0);
      for (int index = 0; index < on_host_->size(); ++index) {
        const std::vector<at::Tensor> parts = columns[index].chunk(hosts, 0);
        for (int host = 0; host < hosts; ++host) chunks[group_rank_[host][index]].copy_(parts[host]);
      }
      return into;
    };
  }

  std::function<at::Tensor()> start_reduce_scatter_sum(const at::Tensor& input) override {
    const int64_t sequence = ++on_host_sequence_;
    on_host_->post_to_sum(sequence, on_host_rank_, input.contiguous());
    const std::vector<at::Tensor> host_sum = on_host_->read_sum(sequence, on_host_rank_).chunk(size(), 0);
    std::vector<at::Tensor> column;  // this member's on-host index, host by host
    for (const std::vector<int>& ranks : group_rank_) column.push_back(host_sum[ranks[on_host_rank_]]);
    return across_hosts_backend_.start_reduce_scatter_sum(at::cat(column));
  }

 private:
  ProcessGroupBackend whole_;
  std::shared_ptr<LocalGroup> on_host_;
  int on_host_rank_;
  c10::intrusive_ptr<C10dGroup> across_hosts_;
  ProcessGroupBackend across_hosts_backend_{across_hosts_};
  std::vector<std::vector<int>> group_rank_;
  int64_t on_host_sequence_ = 0;  // this member's collectives over on_host_ (its device thread only)
};

int64_t payload_bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

Comm::Comm(std::string label, std::shared_ptr<CollectiveCounters> counters)
    : label_(std::move(label)),
      backend_(std::make_shared<SoloBackend>()),
      counters_(counters ? std::move(counters) : std::make_shared<CollectiveCounters>()) {}

Comm::Comm(std::string label, c10::intrusive_ptr<C10dGroup> group, std::shared_ptr<CollectiveCounters> counters)
    : label_(std::move(label)),
      backend_(std::make_shared<ProcessGroupBackend>(std::move(group))),
      counters_(counters ? std::move(counters) : std::make_shared<CollectiveCounters>()) {}

Comm::Comm(std::string label, std::shared_ptr<LocalGroup> local, int rank, c10::intrusive_ptr<C10dGroup> for_exchange,
           std::shared_ptr<CollectiveCounters> counters)
    : label_(std::move(label)),
      backend_(std::make_shared<LocalBackend>(std::move(local), rank,
                                              std::make_unique<ProcessGroupBackend>(std::move(for_exchange)))),
      counters_(counters ? std::move(counters) : std::make_shared<CollectiveCounters>()) {}

Comm::Comm(std::string label, c10::intrusive_ptr<C10dGroup> whole, HostSplit split,
           std::shared_ptr<CollectiveCounters> counters)
    : label_(std::move(label)),
      backend_(std::make_shared<HostSplitBackend>(std::move(whole), std::move(split))),
      counters_(counters ? std::move(counters) : std::make_shared<CollectiveCounters>()) {}

int Comm::rank() const { return backend_->rank(); }
int Comm::size() const { return backend_->size(); }

template <typename Call>
auto Comm::run(Collective kind, int64_t bytes, Call&& call) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t ticket = counters_->begin(label_, kind, ++sequence_, bytes);
  auto finish = [&] {
    counters_->finish(ticket, kind, bytes,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  try {
    if constexpr (std::is_void_v<decltype(call())>) {
      call();
      finish();
    } else {
      auto result = call();
      finish();
      return result;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(fmt::format("{} #{} over {} failed in the transport: {}", collective_name(kind), sequence_,
                                      label_, e.what()));
  }
}

void Comm::allreduce_sum(at::Tensor& tensor) {
  MT_CHECK(tensor.is_contiguous(), "allreduce over {} needs a contiguous tensor", label_);
  run(Collective::allreduce, payload_bytes(tensor), [&] { backend_->allreduce_sum(tensor); });
}

at::Tensor Comm::allgather(const at::Tensor& local, const at::Tensor& into, Collective counted_as) {
  return allgather_async(local, into, counted_as).wait();
}

PendingCollective Comm::allgather_async(const at::Tensor& local, const at::Tensor& into, Collective counted_as) {
  return allgather_async(
      local, [into, options = local.options()](c10::IntArrayRef shape) {
        return into.defined() ? into : at::empty(shape, options);
      },
      counted_as);
}

PendingCollective Comm::allgather_async(const at::Tensor& local, const MakeDestination& make_into,
                                       Collective counted_as) {
  MT_CHECK(local.dim() >= 1, "allgather over {} needs a tensor with at least one dimension", label_);
  std::vector<int64_t> gathered_shape = local.sizes().vec();
  gathered_shape[0] *= size();
  auto destination = [this, make_into, gathered_shape, dtype = local.scalar_type()] {
    at::Tensor into = make_into(gathered_shape);
    MT_CHECK(into.is_contiguous() && into.scalar_type() == dtype && into.sizes().vec() == gathered_shape,
             "allgather over {}: the destination must be a contiguous {} tensor of shape {}", label_,
             c10::toString(dtype), c10::str(c10::IntArrayRef(gathered_shape)));
    return into;
  };
  return start(counted_as, payload_bytes(local), [&] { return backend_->start_allgather(local, destination); });
}

PendingCollective Comm::start(Collective kind, int64_t bytes,
                              const std::function<std::function<at::Tensor()>()>& issue, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  PendingCollective pending;
  pending.kind_ = kind;
  pending.bytes_ = bytes;
  const std::string group = what.empty() ? label_ : fmt::format("{}: {}", label_, what);
  pending.ticket_ = counters_->begin(group, kind, ++sequence_, bytes);
  pending.label_ = fmt::format("{} #{} over {}", collective_name(kind), sequence_, group);
  try {
    pending.finish_ = issue();
  } catch (const std::exception& e) {
    throw CollectiveError(fmt::format("{} failed in the transport: {}", pending.label_, e.what()));
  }
  pending.counters_ = counters_;
  pending.issue_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return pending;
}

bool PendingCollective::done() const { return !finish_ || (done_ && done_()); }

at::Tensor PendingCollective::wait() {
  MT_CHECK(finish_, "PendingCollective::wait called twice (or on a collective that was never started)");
  const auto start = std::chrono::steady_clock::now();
  at::Tensor result;
  try {
    result = finish_();
  } catch (const std::exception& e) {
    throw CollectiveError(fmt::format("{} failed in the transport: {}", label_, e.what()));
  }
  finish_ = nullptr;
  counters_->finish(ticket_, kind_, bytes_,
                    issue_seconds_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return result;
}

void Comm::broadcast(at::Tensor& tensor, int root) {
  MT_CHECK(root >= 0 && root < size(), "broadcast over {}: root {} is outside [0, {})", label_, root, size());
  MT_CHECK(tensor.is_contiguous(), "broadcast over {} needs a contiguous tensor", label_);
  run(Collective::broadcast, payload_bytes(tensor), [&] { backend_->broadcast(tensor, root); });
}

at::Tensor Comm::reduce_scatter_sum(const at::Tensor& input, Collective counted_as) {
  return reduce_scatter_sum_async(input, counted_as).wait();
}

PendingCollective Comm::reduce_scatter_sum_async(const at::Tensor& input, Collective counted_as) {
  const int n = size();
  MT_CHECK(input.dim() >= 1 && input.size(0) % n == 0,
           "reduce_scatter over {}: dim 0 ({}) must be a multiple of the group size {}", label_,
           input.dim() ? input.size(0) : 0, n);
  // Summed in rank order, so the result is the same whatever the network did.
  return start(counted_as, payload_bytes(input), [&] { return backend_->start_reduce_scatter_sum(input); });
}

at::Tensor Comm::all_to_all(const at::Tensor& input) {
  MT_CHECK(input.dim() >= 1 && input.size(0) % size() == 0,
           "all_to_all over {}: dim 0 ({}) must be a multiple of the group size {}", label_,
           input.dim() ? input.size(0) : 0, size());
  return run(Collective::all_to_all, payload_bytes(input), [&] { return backend_->start_all_to_all(input)(); });
}

void Comm::barrier() {
  run(Collective::barrier, 0, [&] { backend_->barrier(); });
}

void Comm::exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                    const std::vector<std::pair<int, at::Tensor>>& receives, int tag, Collective counted_as) {
  exchange_async(sends, receives, tag, counted_as).wait();
}

PendingCollective Comm::exchange_async(const std::vector<std::pair<int, at::Tensor>>& sends,
                                       const std::vector<std::pair<int, at::Tensor>>& receives, int tag,
                                       Collective counted_as, const std::string& what) {
  int64_t bytes = 0;
  for (const auto& [rank, tensor] : sends) {
    MT_CHECK(rank >= 0 && rank < size() && rank != this->rank() && tensor.is_contiguous(),
             "exchange over {}: a send to rank {} (of {}, this is {}) of a tensor that must be contiguous", label_,
             rank, size(), this->rank());
    bytes += payload_bytes(tensor);
  }
  for (const auto& [rank, tensor] : receives)
    MT_CHECK(rank >= 0 && rank < size() && rank != this->rank() && tensor.is_contiguous(),
             "exchange over {}: a receive from rank {} (of {}, this is {}) into a buffer that must be contiguous",
             label_, rank, size(), this->rank());
  std::function<bool()> done;
  PendingCollective pending = start(
      counted_as, bytes,
      [&] {
        CommBackend::StartedExchange started = backend_->start_exchange(sends, receives, tag);
        done = std::move(started.done);
        return started.wait;
      },
      what);
  pending.done_ = std::move(done);
  return pending;
}

}  // namespace meshtrain::runtime
