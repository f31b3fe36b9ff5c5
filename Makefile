# ticketd. `make help` lists the targets.
GO      ?= go
BIN     ?= bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
FUZZTIME ?= 30s

.PHONY: help build run test test-short vet fuzz bench bench-quick bench-tools clean

help:
	@echo "make run          build and start ticketd (single mode, ./ticketd-data)"
	@echo "make test         go vet, then every test with -race"
	@echo "make fuzz         run each fuzz target for FUZZTIME ($(FUZZTIME))"
	@echo "make bench        ticketd vs Redis vs the echo ceiling (about 10 minutes)"
	@echo "make bench-quick  the same, short (about 1 minute)"
	@echo "make build        build ticketd and ticketctl into $(BIN)/"

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ticketd ./cmd/ticketd
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ticketctl ./cmd/ticketctl

run: build
	./$(BIN)/ticketd $(ARGS)

vet:
	$(GO) vet ./...

test: vet
	$(GO) test -race -count=1 -timeout 20m ./...

test-short:
	$(GO) test -short -count=1 ./...

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzParseRequest$$' -fuzztime=$(FUZZTIME) ./codec
	$(GO) test -run='^$$' -fuzz='^FuzzParseAnswer$$' -fuzztime=$(FUZZTIME) ./codec

BENCHFLAGS = -ticketd $(abspath $(BIN))/ticketd -echo $(abspath $(BIN))/echo $(if $(filter 1,$(PROFILE)),-profile)

bench-tools: build
	$(GO) build -o $(BIN)/bench ./bench/cmd/bench
	$(GO) build -o $(BIN)/echo ./bench/cmd/echo

bench: bench-tools
	./$(BIN)/bench $(BENCHFLAGS)

bench-quick: bench-tools
	./$(BIN)/bench -quick $(BENCHFLAGS)

clean:
	rm -rf $(BIN)
