// FieldList: header fields as they go on the wire, "Name: value\r\n" one
// after another in one text, with each field's place in it. A response's
// fields then cost one allocation (not two strings a field in a vector) and
// are written with one append; they read back as name and value for what
// is not HTTP/1 (gRPC's headers, tests).
//
//   FieldList fields;
//   fields.Add("Retry-After", "3");
//   Append(fields.Open("RateLimit"), "\"api\";r=", 0);  fields.Close();
//   out += fields.wire();  // "Retry-After: 3\r\nRateLimit: \"api\";r=0\r\n"
//
// Names and values are sluice's own (literals, numbers, sf-strings): none
// holds CR, LF or NUL; nothing here checks that.
//
// Thread-safety: a value type.
#ifndef SLUICE_POLICY_FIELD_LIST_H_
#define SLUICE_POLICY_FIELD_LIST_H_

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/container/inlined_vector.h"

namespace sluice::policy {

class FieldList {
 public:
  struct Field {
    std::string_view name;
    std::string_view value;
    bool operator==(const Field&) const = default;
  };

  class Iterator {
   public:
    using value_type = Field;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    Iterator(const FieldList* list, size_t i) : list_(list), i_(i) {}
    Field operator*() const { return (*list_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator before = *this;
      ++i_;
      return before;
    }
    bool operator==(const Iterator& other) const { return i_ == other.i_; }

   private:
    const FieldList* list_ = nullptr;
    size_t i_ = 0;
  };

  using value_type = Field;
  using const_iterator = Iterator;

  FieldList() = default;
  FieldList(std::initializer_list<Field> fields) {
    for (const Field& f : fields) Add(f.name, f.value);
  }

  void Add(std::string_view name, std::string_view value) {
    Open(name).append(value);
    Close();
  }
  // A field whose value is a number, written in decimal.
  void Add(std::string_view name, int64_t value) {
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof digits, value).ptr;
    Add(name, std::string_view(digits, static_cast<size_t>(end - digits)));
  }
  // Starts a field named `name`: the caller appends its value to the text
  // returned, then calls Close (nothing else in between).
  std::string& Open(std::string_view name) {
    places_.push_back({.at = static_cast<uint32_t>(text_.size()),
                       .name_size = static_cast<uint32_t>(name.size())});
    text_.append(name);
    text_.append(": ", 2);
    return text_;
  }
  void Close() {
    Place& p = places_.back();
    p.value_size = static_cast<uint32_t>(text_.size() - p.at - p.name_size - 2);
    text_.append("\r\n", 2);
  }
  // Room for `bytes` more of text (one allocation for what follows).
  void Reserve(size_t bytes) { text_.reserve(text_.size() + bytes); }
  // Every field of `other`, after these.
  void Append(const FieldList& other) {
    const auto base = static_cast<uint32_t>(text_.size());
    text_.append(other.text_);
    for (Place p : other.places_) {
      p.at += base;
      places_.push_back(p);
    }
  }

  bool empty() const { return places_.empty(); }
  size_t size() const { return places_.size(); }
  Field operator[](size_t i) const {
    const Place& p = places_[i];
    return {.name = {text_.data() + p.at, p.name_size},
            .value = {text_.data() + p.at + p.name_size + 2, p.value_size}};
  }
  Field back() const { return (*this)[size() - 1]; }
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }

  // Every field, each ended by CRLF, in order: what HTTP/1 writes.
  std::string_view wire() const { return text_; }

 private:
  struct Place {
    uint32_t at = 0;  // where its name starts in text_; ": " and the value follow
    uint32_t name_size = 0;
    uint32_t value_size = 0;
  };

  std::string text_;
  absl::InlinedVector<Place, 6> places_;
};

}  // namespace sluice::policy

#endif  // SLUICE_POLICY_FIELD_LIST_H_
