package apiauth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// DefaultInterval is how often Run looks at the file.
const DefaultInterval = time.Second

// maxFileSize bounds what is read of a tokens file: enough for tens of
// thousands of tokens.
const maxFileSize = 4 << 20

// Options configure a File; the zero value is valid.
type Options struct {
	// Logger receives reloads and errors. Default: slog.Default().
	Logger *slog.Logger
	// Interval is how often Run reads the file to see whether it
	// changed. Default: DefaultInterval.
	Interval time.Duration
}

// File is the tokens of a tokens file, kept up to date by Run. It is a
// httpapi.Authenticator; its methods are safe for concurrent use.
type File struct {
	path  string
	log   *slog.Logger
	every time.Duration

	current atomic.Pointer[tokenSet]

	mu sync.Mutex // serializes Reload
	// seen is the SHA-256 of the content last read, good or not, so that
	// a file that stays malformed is reported once, not every Interval.
	seen [sha256.Size]byte
}

var _ httpapi.Authenticator = (*File)(nil)

// Open reads the tokens file at path. A file that cannot be read or is
// malformed is an error naming the file (and the line).
func Open(path string, opts Options) (*File, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	f := &File{path: path, log: opts.Logger, every: opts.Interval}
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Len is how many tokens are in force.
func (f *File) Len() int { return len(f.current.Load().entries) }

// Authenticate returns the caller token belongs to, if it is in the file
// (as last read well). It compares hashes in constant time.
func (f *File) Authenticate(token string) (dispatch.Caller, bool) {
	e, ok := f.current.Load().lookup(token)
	if !ok {
		return dispatch.Caller{}, false
	}
	return e.Caller(), true
}

// Reload reads the file and, if its content changed since it was last
// read, puts its tokens in force and returns true. A file that cannot be
// read or is malformed leaves the tokens in force as they were and is an
// error; a malformed content is reported once, not again until it changes.
func (f *File) Reload() (changed bool, err error) {
	data, err := readFile(f.path)
	if err != nil {
		return false, err
	}
	return f.load(data)
}

func (f *File) load(data []byte) (changed bool, err error) {
	sum := sha256.Sum256(data)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.current.Load() != nil && sum == f.seen {
		return false, nil
	}
	f.seen = sum
	entries, err := Parse(f.path, data)
	if err != nil {
		return false, err
	}
	f.current.Store(newTokenSet(entries))
	return true, nil
}

func readFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("apiauth: tokens file: %w", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("apiauth: tokens file %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrMalformed, path, maxFileSize)
	}
	return data, nil
}

// Run reads the file every Interval until ctx ends, and puts a changed
// file's tokens in force once it reads the same content twice in a row, so
// a file caught half-written (truncated, not yet filled) is never taken:
// a change is in force within about two intervals. It reads the content
// rather than trusting modification times, so an edit within the same
// second, or a Kubernetes secret whose symlink is swapped, is seen too. A
// file that is malformed, missing or unreadable is logged as an error (once
// until it changes) and the last good tokens stay in force.
func (f *File) Run(ctx context.Context) {
	tick := time.NewTicker(f.every)
	defer tick.Stop()
	var (
		lastErr string
		prev    [sha256.Size]byte
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		data, err := readFile(f.path)
		changed := false
		if err == nil {
			sum := sha256.Sum256(data)
			if sum != prev {
				prev = sum
				continue // until it stays so for an interval
			}
			changed, err = f.load(data)
		}
		switch {
		case err != nil:
			if err.Error() != lastErr {
				f.log.ErrorContext(ctx, "API tokens file not taken; the previous tokens stay in force", "err", err, "tokens", f.Len())
			}
			lastErr = err.Error()
		case changed:
			lastErr = ""
			f.log.InfoContext(ctx, "API tokens file reloaded", "file", f.path, "tokens", f.Len())
		default:
			lastErr = ""
		}
	}
}
