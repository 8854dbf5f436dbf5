// elastic-report: draws events files as a run timeline, one self-contained HTML page (the page
// elastic-run writes at the end of a run; agent/run_timeline.hpp). For a run whose launcher was
// killed before it could write one, or the files of several hosts together:
//
//   elastic-report logs/job7/events.jsonl                 # -> logs/job7/timeline.html
//   elastic-report host-a.jsonl host-b.jsonl -o job7.html  # several hosts on one page
//   cat */events.jsonl | elastic-report - -o - > job7.html
//
// Lines that are not events are skipped and counted on the page. Exit status: 0 written; 1 the
// page could not be written; 2 bad arguments or an input that cannot be read.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <elastic/config.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/private_dir.hpp>

#include "agent/run_timeline.hpp"
#include "command_line.hpp"

namespace {

constexpr int exit_written = 0, exit_unwritten = 1, exit_usage = 2;

/// A mistake in the command line or an input that cannot be read: exit 2.
struct usage_error {
  std::string message;
};

struct request {
  std::vector<std::string> inputs;
  std::string output;
  bool asked = false;  ///< --help or --version, answered
};

request parse_command_line(int argc, char** argv) {
  request r;
  CLI::App app(
      "Draws events files (JSON lines, as elastic-run and the library write them) as a run timeline: one "
      "self-contained HTML page with a lane per worker slot, restarts, kills with their stack dumps, rounds and "
      "rebuilds, checkpoints, stragglers and culprits. Several hosts' files are drawn together.",
      "elastic-report");
  app.set_help_flag("-h,--help", "print this help and exit");
  bool version = false;
  app.add_flag("--version", version, "print the version and exit");
  app.add_option("-o,--output", r.output,
                 "the page to write, - for stdout (default: beside the first EVENTS file: events.jsonl gives "
                 "timeline.html, NAME.jsonl gives NAME.timeline.html; ./timeline.html for stdin)")
      ->check(elastic::tools::any_text("FILE"));
  app.add_option("EVENTS", r.inputs, "events files, - for stdin")->required()->check(elastic::tools::any_text("FILE"));
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer("Exit status: 0 written; 1 the page could not be written; 2 bad arguments or an unreadable input.");
  elastic::tools::name_values_in_help(app);

  const std::vector<std::string_view> args(argv + 1, argv + argc);
  const auto scan = elastic::tools::scan_options(app, args);
  if (scan.asked == app.get_help_ptr()) {
    std::fputs(app.help().c_str(), stdout);
    r.asked = true;
    return r;
  }
  if (scan.asked != nullptr) {
    std::printf("elastic-report %s\n", ELASTIC_VERSION_STRING);
    r.asked = true;
    return r;
  }
  if (!scan.problem.empty()) throw usage_error{scan.problem};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw usage_error{e.what()};
  }
  return r;
}

/// Reads every input into `reader`; an input that cannot be opened or read is a usage error.
void read_inputs(const request& r, elastic::agent::timeline::event_reader& reader) {
  for (const auto& in : r.inputs) {
    elastic::internal::unique_fd owned;
    int fd = STDIN_FILENO;
    if (in != "-") {
      owned = elastic::internal::unique_fd(::open(in.c_str(), O_RDONLY | O_CLOEXEC));
      if (!owned) throw usage_error{fmt::format("cannot open {}: {}", in, std::strerror(errno))};
      fd = owned.get();
    }
    std::string note;
    try {
      reader.add(in == "-" ? "stdin" : in, elastic::agent::read_events_fd(fd, in, elastic::agent::timeline_input_limit, note));
    } catch (const elastic::error& e) {
      throw usage_error{fmt::format("{}: {}", e.message(), e.os_code().message())};
    }
    if (!note.empty()) reader.note(note);
  }
}

/// Writes `page` to `output` ("-": stdout), through private_dir like elastic-run's own page.
void write_page(const std::string& output, const std::string& page) {
  if (output == "-") {
    if (std::fwrite(page.data(), 1, page.size(), stdout) != page.size() || std::fflush(stdout) != 0) {
      throw elastic::os_error("cannot write the page to stdout");
    }
    return;
  }
  const std::filesystem::path path(output);
  const auto name = path.filename();
  if (name.empty() || name == "." || name == "..") {
    throw usage_error{fmt::format("-o {}: name a file, not a directory", output)};
  }
  const auto parent = path.parent_path();
  elastic::internal::private_dir::open(parent.empty() ? std::filesystem::path(".") : parent).write_atomic(name.string(), page);
}

int run(int argc, char** argv) {
  request r;
  try {
    r = parse_command_line(argc, argv);
    if (r.asked) return exit_written;
    if (r.output.empty()) {
      r.output = r.inputs.front() == "-" ? std::string("timeline.html")
                                         : elastic::agent::default_timeline_path(r.inputs.front()).string();
    }
    for (const auto& in : r.inputs) {
      if (in != "-" && r.output != "-" &&
          std::filesystem::absolute(in).lexically_normal() == std::filesystem::absolute(r.output).lexically_normal()) {
        throw usage_error{fmt::format("-o {} is one of the events files: give the page a name of its own", r.output)};
      }
    }
    elastic::agent::timeline::event_reader reader;
    read_inputs(r, reader);
    const auto set = std::move(reader).finish();
    const std::string page = elastic::agent::timeline::render_page(
        elastic::agent::timeline::build_model(set), set, {.generator = fmt::format("elastic-report {}", ELASTIC_VERSION_STRING), .notes = {}});
    write_page(r.output, page);
    std::fprintf(stderr, "elastic-report: %s: %zu events from %zu lines (%zu malformed lines skipped)\n",
                 r.output == "-" ? "written to stdout" : r.output.c_str(), set.events.size() + set.dropped, set.lines,
                 set.malformed);
    return exit_written;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "elastic-report: %s\n(elastic-report --help lists the options)\n", e.message.c_str());
    return exit_usage;
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-report: cannot write %s: %s\n", r.output.c_str(), e.what());
    return e.code() == elastic::errc::unsafe_path ? exit_usage : exit_unwritten;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic-report: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "elastic-report: an unexpected error\n");
  }
  return exit_unwritten;
}
