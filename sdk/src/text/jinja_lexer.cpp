// Jinja's lexer as Jinja2 3.1 lexes with trim_blocks and lstrip_blocks (transformers' settings).
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "jinja_syntax.hpp"
#include "tessera/error.hpp"

namespace tessera::text::jinja {

std::string where(const std::string& name, const Position& at) {
  return name + ":" + std::to_string(at.line) + ":" + std::to_string(at.column);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip(const std::string& s) {
  std::size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  return s.substr(0, end);
}

// Newlines as Jinja normalises them (\r\n and \r to \n), and without the one trailing newline
// (keep_trailing_newline is off).
std::string normalise(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : src_(normalise(source)), name_(name) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const std::size_t tag = next_tag(pos_);
      std::string text = src_.substr(pos_, (tag == std::string::npos ? src_.size() : tag) - pos_);
      if (tag == std::string::npos) {
        emit_text(text, position_of(pos_));
        advance_to(src_.size());
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char mark = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      text = strip_before_tag(text, type, mark, line_starting);
      emit_text(text, position_of(pos_));
      advance_to(tag + 2 + (mark == '-' || mark == '+' ? 1 : 0));
      const std::size_t before = pos_;
      if (type == '#') {
        comment(tag);
      } else if (type == '{') {
        expression_tag(Token::Kind::variable_begin, Token::Kind::variable_end, '}', tag);
      } else if (!raw_block(tag, mark)) {
        expression_tag(Token::Kind::block_begin, Token::Kind::block_end, '%', tag);
      }
      line_starting = pos_ > before && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{Token::Kind::end, "", 0, 0, position_of(pos_)});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const Position& at, const std::string& what) const {
    throw tessera::Error(where(name_, at) + ": " + what);
  }

  Position position_of(std::size_t offset) {
    while (counted_ < offset) {
      if (src_[counted_] == '\n') {
        ++counted_at_.line;
        counted_at_.column = 1;
      } else if ((static_cast<unsigned char>(src_[counted_]) & 0xc0) != 0x80) {
        ++counted_at_.column;
      }
      ++counted_;
    }
    return counted_at_;
  }

  void advance_to(std::size_t offset) { pos_ = offset; }

  std::size_t next_tag(std::size_t from) const {
    for (std::size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // `-` strips all whitespace before the tag; lstrip_blocks strips a block's or comment's
  // indentation when only whitespace is before it on its line (`+` keeps it).
  std::string strip_before_tag(const std::string& text, char type, char mark, bool line_starting) const {
    if (mark == '-') return rstrip(text);
    if (mark == '+' || type == '{') return text;
    const std::size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (line_begin == 0 && !line_starting) return text;
    if (line_begin == text.size()) return text;
    for (std::size_t i = line_begin; i < text.size(); ++i) {
      if (!is_space(text[i])) return text;
    }
    return text.substr(0, line_begin);
  }

  void emit_text(const std::string& text, Position at) {
    if (!text.empty()) tokens_.push_back(Token{Token::Kind::text, text, 0, 0, at});
  }

  // After `%}` or `#}`: `-` strips the whitespace that follows, trim_blocks one newline.
  void after_block_end(char mark) {
    if (mark == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (mark != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  void comment(std::size_t tag) {
    const std::size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail(position_of(tag), "missing end of comment tag");
    const char mark = close > pos_ ? src_[close - 1] : '\0';
    pos_ = close + 2;
    after_block_end(mark);
  }

  // {% raw %}...{% endraw %}: the content as text.
  bool raw_block(std::size_t tag, char mark) {
    std::size_t i = pos_;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && is_space(src_[i])) ++i;
    char open_mark = '\0';
    if (i < src_.size() && src_[i] == '-') open_mark = '-', ++i;
    if (src_.compare(i, 2, "%}") != 0) return false;
    (void)mark;
    pos_ = i + 2;
    if (open_mark == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    }
    for (std::size_t search = pos_;;) {
      const std::size_t end_tag = src_.find("{%", search);
      if (end_tag == std::string::npos) fail(position_of(tag), "missing end of raw directive");
      std::size_t j = end_tag + 2;
      const char end_mark = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j++] : '\0';
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) {
        search = end_tag + 2;
        continue;
      }
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      char close_mark = '\0';
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) close_mark = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) fail(position_of(end_tag), "expected '%}' after endraw");
      std::string content = src_.substr(pos_, end_tag - pos_);
      content = strip_before_tag(content, '%', end_mark, false);
      tokens_.push_back(Token{Token::Kind::text, content, 0, 0, position_of(pos_)});
      pos_ = j + 2;
      after_block_end(close_mark);
      return true;
    }
  }

  void expression_tag(Token::Kind begin, Token::Kind end, char closer, std::size_t tag) {
    tokens_.push_back(Token{begin, "", 0, 0, position_of(tag)});
    std::vector<char> open;  // brackets awaiting their closer
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) fail(position_of(tag), std::string("missing end of tag '") + closer + "}'");
      if (open.empty()) {
        const bool marked = (src_[pos_] == '-' || (closer == '%' && src_[pos_] == '+')) &&
                            src_.compare(pos_ + 1, 2, std::string(1, closer) + "}") == 0;
        if (marked || src_.compare(pos_, 2, std::string(1, closer) + "}") == 0) {
          const char mark = marked ? src_[pos_] : '\0';
          tokens_.push_back(Token{end, "", 0, 0, position_of(pos_)});
          pos_ += marked ? 3 : 2;
          if (closer == '%') {
            after_block_end(mark);
          } else if (mark == '-') {
            while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
          }
          return;
        }
      }
      lex_one(open);
    }
  }

  void lex_one(std::vector<char>& open) {
    const Position at = position_of(pos_);
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t end = pos_;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      tokens_.push_back(Token{Token::Kind::name, src_.substr(pos_, end - pos_), 0, 0, at});
      pos_ = end;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(at);
    if (c == '\'' || c == '"') return string(at);
    static const char* const two[] = {"**", "//", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back(Token{Token::Kind::op, op, 0, 0, at});
        pos_ += 2;
        return;
      }
    }
    if (std::string("+-*/%~[](){}><=.:|,;").find(c) == std::string::npos) {
      fail(at, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') open.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (open.empty() || open.back() != c) fail(at, std::string("unexpected '") + c + "'");
      open.pop_back();
    }
    tokens_.push_back(Token{Token::Kind::op, std::string(1, c), 0, 0, at});
    ++pos_;
  }

  void number(const Position& at) {
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::op && tokens_.back().text == ".";
    std::size_t end = pos_;
    std::string digits;
    const auto take_digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
        if (src_[end] != '_') digits += src_[end];
        ++end;
      }
    };
    take_digits();
    bool real = false;
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      real = true;
      digits += src_[end++];
      take_digits();
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      std::size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        real = true;
        digits += 'e';
        digits.append(src_, end + 1, e - end - 1);
        end = e;
        take_digits();
      }
    }
    Token t{real ? Token::Kind::real : Token::Kind::integer, digits, 0, 0, at};
    if (real) {
      t.real = std::strtod(digits.c_str(), nullptr);
    } else {
      t.integer = std::strtoll(digits.c_str(), nullptr, 10);
    }
    tokens_.push_back(std::move(t));
    pos_ = end;
  }

  static void append_utf8(std::uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // A string literal with Python's escapes (Jinja decodes them with unicode-escape).
  void string(const Position& at) {
    const char quote = src_[pos_];
    std::string out;
    std::size_t i = pos_ + 1;
    for (;;) {
      if (i >= src_.size()) fail(at, "unterminated string");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        out += c;
        ++i;
        continue;
      }
      const char e = src_[i + 1];
      i += 2;
      const auto hex = [&](int n) {
        if (i + static_cast<std::size_t>(n) > src_.size()) fail(at, "truncated \\x, \\u or \\U escape");
        const std::string digits = src_.substr(i, static_cast<std::size_t>(n));
        for (char d : digits) {
          if (!std::isxdigit(static_cast<unsigned char>(d))) fail(at, "invalid \\x, \\u or \\U escape");
        }
        i += static_cast<std::size_t>(n);
        const auto cp = static_cast<std::uint32_t>(std::strtoul(digits.c_str(), nullptr, 16));
        if (cp > 0x10ffff) fail(at, "escape outside Unicode");
        append_utf8(cp, out);
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            std::uint32_t cp = static_cast<std::uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) cp = cp * 8 + static_cast<std::uint32_t>(src_[i++] - '0');
            append_utf8(cp, out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(Token{Token::Kind::string, std::move(out), 0, 0, at});
    pos_ = i + 1;
  }

  std::string src_;
  const std::string& name_;
  std::size_t pos_ = 0;
  std::size_t counted_ = 0;
  Position counted_at_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) { return Lexer(source, name).run(); }

}  // namespace tessera::text::jinja
