//go:build !unix

package main

import "errors"

func freeSpace(string) (free, total uint64, err error) {
	return 0, 0, errors.ErrUnsupported
}
