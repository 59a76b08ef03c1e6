// `roll tokenize --tokenizer FILE [--decode] [--add-special-tokens]`
// Reads standard input line by line: text to space-separated ids, or (with
// --decode) ids back to text. One output line per input line.

#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/models/tokenizer.h"

namespace roll {

int TokenizeCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"tokenizer"}, {"decode", "add-special-tokens", "skip-special-tokens"});
  if (!flags.ok()) return CliFail(flags.status());
  auto path = flags->Required("tokenizer");
  if (!path.ok()) return CliFail(path.status());
  auto tok = Tokenizer::FromFile(*path);
  if (!tok.ok()) return CliFail(tok.status());
  const bool decode = flags->Has("decode");
  std::string line;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
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
