package main

import (
	"context"

	"go.uber.org/zap"

	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/single"
)

// admin is the optional admin listener; a nil *admin is off.
type admin struct{}

func startAdmin(cfg *config, log *zap.Logger) (*admin, error) { return nil, nil }

func (a *admin) latency() netloop.Observer { return nil }

func (a *admin) ready(*netloop.Server, *single.Runner) {}

func (a *admin) stop(context.Context) {}
