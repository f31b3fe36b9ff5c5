// Package codec provides the ticketd wire protocol: a parser for request frames
// that works in place on a network read buffer, append-style encoders for answers
// and requests, and a parser for answers on the client side.
//
// # Buffer lifetime
//
// ParseRequest and ParseAnswer return fields as sub-slices of the buffer they
// parse, without copying. Those slices die with the buffer: with gnet, a slice
// taken from a Peek is valid until the next Discard. Copy a field before keeping
// it past that point or handing it to another goroutine. Neither parser modifies
// the buffer. The returned fields have their capacity cut to their length, so an
// append to one copies rather than overwriting the next frame.
//
// # Concurrency and allocation
//
// Every function is safe for concurrent use: the package keeps no mutable state.
// The parsers never allocate; errors are package-level values. The encoders
// allocate only when dst lacks room, and then at most once per call.
//
// # Request errors and their order
//
// A bad frame gets one error, the first that applies in this order:
//
//  1. too-long: no "\n" within the first MaxLine (1024) bytes, "\r\n" counting as
//     two. So 1023 bytes and "\n" is a line, 1023 bytes and "\r\n" is too-long.
//     With fewer than 1024 bytes and no "\n" the frame is incomplete, not bad.
//  2. syntax, empty line: nothing before the terminator.
//  3. command: the first field (the bytes before the first space) is not exactly
//     "A" or "R". A line that starts with a space has an empty first field, which
//     is a syntax error (empty field), not a command error.
//  4. syntax, empty field (a leading, trailing or double space), then wrong field
//     count (A takes 5 fields, R takes 3).
//  5. syntax, per field from left to right: a key or owner that is too long
//     (checked before its bytes), that holds a byte not allowed (a control byte
//     0x00-0x1F including a lone "\r", or 0x7F; bytes from 0x80 up are allowed),
//     or a malformed number (anything but digits, a sign, a leading zero other
//     than "0" itself).
//  6. range, per field from left to right, only once every field is well formed:
//     lease_ms 0 or above the maximum, wait_ms above the maximum, token 0. A
//     well-formed number above 2^64-1 is a range error in every number field.
//
// For an R frame the fields are token then key, so "R 0 k\x01" is a syntax error
// (the key) and "R 0 k" a range error. A "\r" counts as the terminator only right
// before the "\n"; "\r\r\n" leaves a "\r" in the last field.
//
// # Answers
//
// ParseAnswer accepts exactly what the encoders write (plus an optional "\r"
// before the "\n"): the field counts of each kind, tokens 1 to 2^64-1 without
// leading zeros, owners and keys within their limits and byte rules. An E answer
// is "E <code> <text>" where text is the rest of the line and may hold spaces; a
// code this version does not know is accepted, for a later protocol may add one.
// Every ParseAnswer error matches ErrBadAnswer.
package codec
