// `roll tokenize --tokenizer FILE [--decode] [--json] [--add-special-tokens]`
// Reads standard input line by line: text to space-separated ids, or (with
// --decode) ids back to text. One output line per input line. With --json
// every line is one JSON value, a string to encode (or a list of ids to
// decode) in and a list of ids (or a string) out, so texts may hold
// newlines and any other character.

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/models/tokenizer.h"

namespace roll {

int TokenizeCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"tokenizer"}, {"decode", "json", "add-special-tokens", "skip-special-tokens"});
  if (!flags.ok()) return CliFail(flags.status());
  auto path = flags->Required("tokenizer");
  if (!path.ok()) return CliFail(path.status());
  auto tok = Tokenizer::FromFile(*path);
  if (!tok.ok()) return CliFail(tok.status());
  const bool decode = flags->Has("decode");
  const bool json = flags->Has("json");
  std::string line;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (json) {
      const std::string where = absl::StrCat("stdin line ", line_no);
      nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!decode) {
        if (!in.is_string()) {
          return CliFail(absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON string")));
        }
        std::cout << nlohmann::json(tok->Encode(in.get<std::string>(), flags->Has("add-special-tokens"))).dump()
                  << "\n";
        continue;
      }
      std::vector<int32_t> ids;
      bool ok = in.is_array();
      for (const auto& v : in) {
        if (!ok || !v.is_number_integer()) {
          ok = false;
          break;
        }
        ids.push_back(v.get<int32_t>());
      }
      if (!ok) return CliFail(absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON list of token ids")));
      auto text = tok->Decode(ids, flags->Has("skip-special-tokens"));
      if (!text.ok()) return CliFail(Annotate(text.status(), where));
      // Decoded bytes that are not valid UTF-8 come out replaced, not thrown.
      std::cout << nlohmann::json(*text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      continue;
    }
    if (!decode) {
      std::cout << absl::StrJoin(tok->Encode(line, flags->Has("add-special-tokens")), " ") << "\n";
      continue;
    }
    std::vector<int32_t> ids;
    for (absl::string_view piece : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
      int32_t id;
      if (!absl::SimpleAtoi(piece, &id)) {
        return CliFail(absl::InvalidArgumentError(
            absl::StrCat("stdin line ", line_no, ": '", piece, "' is not a token id")));
      }
      ids.push_back(id);
    }
    auto text = tok->Decode(ids, flags->Has("skip-special-tokens"));
    if (!text.ok()) return CliFail(Annotate(text.status(), absl::StrCat("stdin line ", line_no)));
    std::cout << *text << "\n";
  }
  return 0;
}

}  // namespace roll
