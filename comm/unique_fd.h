// UniqueFd: owns one POSIX file descriptor and closes it on destruction.
#ifndef FUSEBOX_COMM_UNIQUE_FD_H_
#define FUSEBOX_COMM_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace fusebox::comm {

// Move-only; never throws. reset() closes the current descriptor (if any)
// and takes `fd`.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_UNIQUE_FD_H_
