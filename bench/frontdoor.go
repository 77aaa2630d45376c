//go:build !dispatchhandler

package main

import (
	"net/http"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// frontDoor is the dispatcher's HTTP front door (the API and /mcp).
// compare.sh builds with -tags dispatchhandler for a commit from before
// pkg/dispatch/httpapi (frontdoor_handler.go).
func frontDoor(d *dispatch.Dispatcher) http.Handler { return httpapi.New(d, httpapi.Options{}) }
