// prepare.cpp — the prepare pipeline: read documents in batches, tokenize the batches on a pool of threads, write
// them in input order into shards while the pool goes on.
#include "meshtrain/token_shards/prepare.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"

namespace meshtrain::token_shards {
namespace fs = std::filesystem;

namespace {

constexpr size_t kBatchTextBytes = 1 << 20;      // text per batch handed to one thread
constexpr size_t kLargeDocumentBytes = 8 << 20;  // a document this large is tokenized by all threads together

struct Source {
  fs::path path;
  bool jsonl;
};

std::vector<Source> list_sources(const std::vector<fs::path>& inputs) {
  std::vector<Source> sources;
  auto add = [&](const fs::path& file) { sources.push_back({file, file.extension() == ".jsonl"}); };
  for (const fs::path& input : inputs) {
    MT_USER_CHECK(fs::exists(input), "input {} does not exist", input.string());
    if (!fs::is_directory(input)) {
      add(input);
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(input)) {
      std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".txt" || ext == ".jsonl")) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    MT_USER_CHECK(!files.empty(), "input directory {} holds no .txt or .jsonl files", input.string());
    for (const fs::path& file : files) add(file);
  }
  MT_USER_CHECK(!sources.empty(), "prepare needs at least one input file");
  return sources;
}

// A batch of raw documents: whole text files, or JSONL lines still to be parsed (parsing runs on the pool).
struct Batch {
  const Source* source = nullptr;
  uint64_t first_line = 0;  // JSONL: the line number of texts[0]
  std::vector<std::string> texts;
  size_t bytes = 0;
  // Filled by the pool: the tokens of every document, and where each ends.
  std::vector<uint32_t> tokens;
  std::vector<size_t> document_ends;
};

// Reads documents from the sources in order, in batches of about kBatchTextBytes.
class DocumentReader {
 public:
  explicit DocumentReader(const std::vector<Source>& sources) : sources_(sources) {}

  std::optional<Batch> next() {
    while (current_ < sources_.size()) {
      const Source& source = sources_[current_];
      if (!source.jsonl) {
        Batch batch{&source, 0, {tokenizer::read_file_bytes(source.path)}, 0, {}, {}};
        batch.bytes = batch.texts[0].size();
        ++current_;
        return batch;
      }
      if (!stream_.is_open()) {
        stream_.open(source.path, std::ios::binary);
        MT_USER_CHECK(stream_, "cannot open {}", source.path.string());
        line_ = 0;
      }
      Batch batch{&source, line_ + 1, {}, 0, {}, {}};
      std::string line;
      while (batch.bytes < kBatchTextBytes && std::getline(stream_, line)) {
        ++line_;
        batch.bytes += line.size() + 1;
        batch.texts.push_back(std::move(line));
      }
      if (stream_.eof()) {
        stream_.close();
        stream_.clear();
        ++current_;
      }
      if (!batch.texts.empty()) return batch;
    }
    return std::nullopt;
  }

 private:
  const std::vector<Source>& sources_;
  size_t current_ = 0;
  std::ifstream stream_;
  uint64_t line_ = 0;
};

// Tokenizes every document of `batch` with one thread (`threads` for a document of kLargeDocumentBytes or more).
void tokenize_batch(const tokenizer::Tokenizer& tokenizer, const std::string& text_field, int threads, Batch& batch) {
  std::optional<uint32_t> separator = tokenizer.end_of_text_id();
  batch.tokens.reserve(batch.bytes / 3 + batch.texts.size() + 16);
  for (size_t i = 0; i < batch.texts.size(); ++i) {
    const std::string& raw = batch.texts[i];
    std::string text;
    if (batch.source->jsonl) {
      if (raw.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      const nlohmann::json json =
          parse_json(raw, fmt::format("{}:{}", batch.source->path.string(), batch.first_line + i));
      MT_USER_CHECK(json.is_object() && json.contains(text_field) && json[text_field].is_string(),
                    "{}:{}: expected a string field \"{}\" (set another with --text-field)",
                    batch.source->path.string(), batch.first_line + i, text_field);
      text = json[text_field].get<std::string>();
    }
    std::string_view document = batch.source->jsonl ? std::string_view(text) : std::string_view(raw);
    if (separator) batch.tokens.push_back(*separator);
    if (document.size() >= kLargeDocumentBytes && threads > 1) {
      std::vector<uint32_t> ids = tokenizer.encode_parallel(document, threads);
      batch.tokens.insert(batch.tokens.end(), ids.begin(), ids.end());
    } else {
      tokenizer.encode(document, batch.tokens);
    }
    batch.document_ends.push_back(batch.tokens.size());
  }
  batch.texts.clear();
  batch.texts.shrink_to_fit();
}

// Tokenizes the reader's batches on `threads` workers that live for the whole run, and hands them out in input
// order. Each worker keeps its thread's piece cache (see tokenizer.cpp) warm from one batch to the next; a thread
// started per round of batches began with an empty one every time. One worker at a time reads the next batch (the
// reader is sequential; the read runs outside the lock, so the others file their batches meanwhile), tokenizes it
// and files it by its number; next() waits for the batch whose turn it is, so the caller writes batch n while the
// workers tokenize the batches after it. At most 2 batches per worker are read and not yet handed out. A failure
// (reading or tokenizing) stops the workers and is rethrown by next().
class TokenizingPool {
 public:
  // `tokenize(batch, threads)`: `threads` is how many cores are not tokenizing another batch (at least 1), for a
  // large document.
  TokenizingPool(DocumentReader& reader, std::function<void(Batch&, int)> tokenize, int threads)
      : reader_(reader), tokenize_(std::move(tokenize)), threads_(threads), window_(2 * static_cast<uint64_t>(threads)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~TokenizingPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }
  TokenizingPool(const TokenizingPool&) = delete;
  TokenizingPool& operator=(const TokenizingPool&) = delete;

  // The next batch in input order, tokenized; nullopt after the last.
  std::optional<Batch> next() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      return failure_ || done_.count(next_out_) || (reader_done_ && next_out_ == next_in_);
    });
    if (failure_) std::rethrow_exception(failure_);
    auto it = done_.find(next_out_);
    if (it == done_.end()) return std::nullopt;
    Batch batch = std::move(it->second);
    done_.erase(it);
    ++next_out_;
    changed_.notify_all();  // a worker may read another batch
    return batch;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] {
        return stopping_ || failure_ || reader_done_ || (!reading_ && next_in_ < next_out_ + window_);
      });
      if (stopping_ || failure_ || reader_done_) return;
      reading_ = true;
      lock.unlock();
      std::optional<Batch> batch;
      std::exception_ptr read_failure;
      try {
        batch = reader_.next();
      } catch (...) {
        read_failure = std::current_exception();
      }
      lock.lock();
      reading_ = false;
      if (read_failure) {
        fail(read_failure);
        return;
      }
      if (!batch) {
        reader_done_ = true;
        changed_.notify_all();
        return;
      }
      const uint64_t n = next_in_++;
      const int idle_cores = threads_ - busy_;
      ++busy_;
      lock.unlock();
      changed_.notify_all();  // another worker may read the next batch
      std::exception_ptr failure;
      try {
        tokenize_(*batch, std::max(1, idle_cores));
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      --busy_;
      if (failure) {
        fail(failure);
        return;
      }
      done_.emplace(n, std::move(*batch));
      changed_.notify_all();
    }
  }
  void fail(std::exception_ptr failure) {  // under the lock
    if (!failure_) failure_ = failure;
    changed_.notify_all();
  }

  DocumentReader& reader_;
  std::function<void(Batch&, int)> tokenize_;
  const int threads_;
  const uint64_t window_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false, reader_done_ = false;
  bool reading_ = false;  // a worker is reading the next batch (outside the lock)
  std::exception_ptr failure_;
  uint64_t next_in_ = 0, next_out_ = 0;  // the numbers of the next batch to read and to hand out
  int busy_ = 0;                         // workers tokenizing a batch
  std::map<uint64_t, Batch> done_;       // tokenized, not yet handed out
  std::vector<std::thread> workers_;
};

class ProgressBar {
 public:
  ProgressBar(bool enabled, uint64_t total_bytes) : enabled_(enabled), total_(std::max<uint64_t>(total_bytes, 1)) {}
  void update(uint64_t bytes, uint64_t tokens) {
    if (!enabled_) return;
    double fraction = std::min(1.0, double(bytes) / double(total_));
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    int filled = int(fraction * 30);
    std::fprintf(stderr, "\rprepare [%s%s] %3.0f%%  %.1f / %.1f MB  %llu tokens  %.2f M tokens/s ",
                 std::string(filled, '#').c_str(), std::string(30 - filled, '.').c_str(), fraction * 100, bytes / 1e6,
                 total_ / 1e6, static_cast<unsigned long long>(tokens), seconds > 0 ? tokens / seconds / 1e6 : 0.0);
    std::fflush(stderr);
  }
  void done() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  uint64_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

ShardIndex prepare_token_shards(const tokenizer::Tokenizer& tokenizer, const PrepareOptions& options) {
  std::vector<Source> sources = list_sources(options.inputs);
  const fs::path output = options.output_dir;
  MT_USER_CHECK(!output.empty(), "prepare needs an output directory");
  MT_USER_CHECK(options.overwrite || !fs::exists(output), "{} already exists (pass --force to replace it)",
                output.string());
  int threads = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));

  fs::path partial = output.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(partial);
  fs::create_directories(partial);

  ShardIndex index;
  index.tokenizer = {tokenizer.name(), tokenizer.kind(), tokenizer.fingerprint(), tokenizer.vocab_size(),
                     tokenizer.end_of_text_id() ? int64_t(*tokenizer.end_of_text_id()) : -1};
  index.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  uint64_t total_bytes = 0;
  for (const Source& source : sources) {
    index.sources.push_back(source.path.string());
    total_bytes += fs::file_size(source.path);
  }

  std::optional<ShardWriter> writer;
  auto close_shard = [&] {
    ShardEntry entry = writer->finish();
    index.total_tokens += entry.tokens;
    index.total_documents += entry.documents;
    index.shards.push_back(entry);
    writer.reset();
  };
  auto write_batch = [&](const Batch& batch) {
    size_t begin = 0;
    for (size_t end : batch.document_ends) {
      if (!writer) {
        std::string file = fmt::format("shard_{:05d}.tok", index.shards.size());
        writer.emplace(partial / file, index.token_bytes, tokenizer.name(), tokenizer.fingerprint());
      }
      writer->append_document(batch.tokens.data() + begin, end - begin);
      begin = end;
      if (writer->token_count() >= options.shard_tokens) close_shard();
    }
  };

  ProgressBar progress(options.progress, total_bytes);
  DocumentReader reader(sources);
  uint64_t bytes_done = 0, tokens_done = 0;
  try {
    TokenizingPool pool(
        reader, [&](Batch& batch, int idle_cores) { tokenize_batch(tokenizer, options.text_field, idle_cores, batch); },
        threads);
    while (std::optional<Batch> batch = pool.next()) {
      write_batch(*batch);
      bytes_done += batch->bytes;
      tokens_done += batch->tokens.size();
      progress.update(bytes_done, tokens_done);
    }
    if (writer && writer->document_count() > 0) close_shard();
  } catch (...) {
    writer.reset();
    fs::remove_all(partial);
    throw;
  }
  progress.done();

  // The index is the last file written; then the directory takes its final name.
  write_file_atomically(partial / kIndexFileName, index_to_json(index));
  if (fs::exists(output)) {
    fs::path old = output.string() + ".old-" + std::to_string(::getpid());
    fs::rename(output, old);
    fs::rename(partial, output);
    fs::remove_all(old);
  } else {
    if (output.has_parent_path()) fs::create_directories(output.parent_path());
    fs::rename(partial, output);
  }
  return index;
}

}  // namespace meshtrain::token_shards
