// Header fields as Beast's parser (basic_parser) reads them: every field's
// name and value in one text, in the order they came, each with its place
// and Beast's name for it, instead of Beast's field table (basic_fields),
// where each field is a node allocated and placed in a tree. The request a
// client sends (HttpRequest, http_request.h) and the answer an upstream
// sends (UpstreamAnswer, upstream_answer.h) keep their fields in one, and
// their parsers share the callbacks that fill it (WholeMessageParser).
// Internal to the server; header-only and free of Asio.
//
// Thread-safety: a value type.
#ifndef SLUICE_SERVER_PARSED_FIELDS_H_
#define SLUICE_SERVER_PARSED_FIELDS_H_

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/field.hpp>

#include "absl/container/inlined_vector.h"

namespace sluice::server {

inline std::string_view View(boost::beast::string_view s) { return {s.data(), s.size()}; }

// Whether two field names are the same name (compared without case).
inline bool SameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         boost::beast::iequals(boost::beast::string_view(a.data(), a.size()),
                               boost::beast::string_view(b.data(), b.size()));
}

// Whether two field names are one as a CGI-style gateway reads them:
// without case, and with '_' the same as '-'. PHP, WSGI and Rack servers
// hand a field to the application as HTTP_X_API_KEY, so in some of them
// (Puma before 6.4.3, Gunicorn before 22) `X_Api_Key` arrives as
// `X-Api-Key` would, or overwrites it.
inline bool SameNameToCgi(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const char x = a[i] == '_' ? '-' : a[i];
    const char y = b[i] == '_' ? '-' : b[i];
    if (x != y && ((x | 0x20) != (y | 0x20) || (x | 0x20) < 'a' || (x | 0x20) > 'z')) return false;
  }
  return true;
}

// "Name: value\r\n" appended to `out`: one growth of `out` and three
// copies (four appends checked the room four times, on a dozen fields a
// gatewayed request).
inline void AppendField(std::string_view name, std::string_view value, std::string& out) {
  const size_t at = out.size();
  out.resize(at + name.size() + value.size() + 4);
  char* p = out.data() + at;
  std::memcpy(p, name.data(), name.size());
  p += name.size();
  *p++ = ':';
  *p++ = ' ';
  std::memcpy(p, value.data(), value.size());
  p += value.size();
  *p++ = '\r';
  *p = '\n';
}

// "Content-Length: <length>\r\n" appended to `out`: the one canonical form.
inline void AppendLength(size_t length, std::string& out) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, length).ptr;
  out += "Content-Length: ";
  out.append(digits, static_cast<size_t>(end - digits));
  out += "\r\n";
}

struct ParsedFields {
  struct Field {
    boost::beast::http::field name = boost::beast::http::field::unknown;
    uint32_t at = 0;  // where its name starts in `text`; its value follows
    uint32_t name_size = 0;
    uint32_t value_size = 0;
    bool kept = true;  // false: not for the next hop (dropped on the way)
  };

  // The text of a common message's fields, in one allocation.
  static constexpr size_t kTextBytes = 512;

  std::string text;  // every field's name and value, one after the other
  absl::InlinedVector<Field, 12> fields;

  std::string_view Name(const Field& f) const { return {text.data() + f.at, f.name_size}; }
  std::string_view Value(const Field& f) const {
    return {text.data() + f.at + f.name_size, f.value_size};
  }

  // A field as the parser read it (its name as it came, and Beast's name).
  void Add(boost::beast::http::field name, boost::beast::string_view name_string,
           boost::beast::string_view value) {
    Field& f = fields.emplace_back();
    f.name = name;
    f.at = static_cast<uint32_t>(text.size());
    f.name_size = static_cast<uint32_t>(name_string.size());
    f.value_size = static_cast<uint32_t>(value.size());
    text.append(name_string.data(), name_string.size());
    text.append(value.data(), value.size());
  }

  // The value of the first kept field named `name` (compared as field
  // names are), or nullopt.
  std::optional<std::string_view> Find(std::string_view name) const {
    for (const Field& f : fields) {
      if (f.kept && SameName(Name(f), name)) return Value(f);
    }
    return std::nullopt;
  }
  // The same for a name Beast knows (field::unknown is no name).
  std::optional<std::string_view> Find(boost::beast::http::field name) const {
    for (const Field& f : fields) {
      if (f.kept && f.name == name && name != boost::beast::http::field::unknown) return Value(f);
    }
    return std::nullopt;
  }

  // Every field named `name` is no longer kept.
  void Drop(std::string_view name) {
    for (Field& f : fields) {
      if (f.kept && SameName(Name(f), name)) f.kept = false;
    }
  }
  void Drop(boost::beast::http::field name) {
    if (name == boost::beast::http::field::unknown) return;
    for (Field& f : fields) {
      if (f.name == name) f.kept = false;
    }
  }

  // Appends the kept fields, as they came, one "Name: value\r\n" each.
  void AppendKept(std::string& out) const {
    for (const Field& f : fields) {
      if (f.kept) AppendField(Name(f), Value(f), out);
    }
  }
};

// What a parser that keeps a whole message does with Beast's basic_parser
// once the start line is read (RequestParser, AnswerParser): each field
// into `Derived::Fields()` (a ParsedFields), the body, de-chunked, into
// `Derived::Body()` (a std::string). `Derived` reads its start line
// (on_request_impl or on_response_impl; the other does nothing).
template <bool kIsRequest, typename Derived>
class WholeMessageParser : public boost::beast::http::basic_parser<kIsRequest> {
 public:
  // The most of a body reserved before it comes (Beast's string_body
  // reserves what Content-Length says, up to the body limit).
  static constexpr size_t kReserveBytes = 1024 * 1024;

 protected:
  using string_view = boost::beast::string_view;
  using error_code = boost::beast::error_code;

  void on_request_impl(boost::beast::http::verb, string_view, string_view, int,
                       error_code&) override {}
  void on_response_impl(int, string_view, int, error_code&) override {}

 private:
  Derived& self() { return static_cast<Derived&>(*this); }

  void on_field_impl(boost::beast::http::field name, string_view name_string, string_view value,
                     error_code&) final {
    // A chunked body's trailer fields are dropped (Beast would add them to
    // the header's): the message goes on with one Content-Length and no
    // trailer, and RFC 9110 section 6.5.2 forbids merging a trailer field
    // into the header section unless its definition allows it. Merged, a
    // client's trailer could carry a second key header (X-Api-Key) that an
    // upstream reading the last value took, after the first had been
    // limited. (Beast still refuses one of the framing fields there.)
    if (this->is_header_done()) return;
    self().Fields().Add(name, name_string, value);
  }
  void on_header_impl(error_code&) final {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         error_code& ec) final {
    // Room for the body the message says, up to a bound: Beast 1.74 also
    // calls this for a length past its body limit (an eager parser with
    // bytes after the header), that limit's error already in `ec`.
    if (!ec && content_length) {
      self().Body().reserve(
          static_cast<size_t>(std::min<std::uint64_t>(*content_length, kReserveBytes)));
    }
  }
  std::size_t on_body_impl(string_view body, error_code&) final {
    self().Body().append(body.data(), body.size());
    return body.size();
  }
  void on_chunk_header_impl(std::uint64_t, string_view, error_code&) final {}
  std::size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code&) final {
    self().Body().append(body.data(), body.size());
    return body.size();
  }
  void on_finish_impl(error_code&) final {}
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_PARSED_FIELDS_H_
