package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// namesCmd is dispatcher functions reserve|transfer|release: an operator
// deciding who owns a function name. Unlike the inspection commands it
// writes the registry, so it connects to NATS as the dispatcher's user,
// as dispatcher tools does.
func namesCmd(ctx context.Context, op string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher functions "+op, flag.ContinueOnError)
	fs.SetOutput(stderr)
	team := fs.String("team", "", "reserve: the team the name is kept for; transfer: the team it passes to")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher functions reserve NAME -team T | transfer NAME -team T | release NAME\n\n"+
			"Each applies to NAME and every name that reads as it (case-folded, '-' as '_', runs of '_' as one, outer '_' ignored).\n"+
			"  reserve   keep the name for team T, served or not, until released; refused if another team owns it\n"+
			"  transfer  make T the owner (reserved); the previous owner's executors are refused from their next renewal\n"+
			"  release   free the name at once (a name still served is claimed again by its team's next renewal)\n\n"+
			"Connects to NATS_URL (NATS_NKEY or NATS_CREDS: the dispatcher's user), or to the embedded server at TOOLRELAY_NATS_LISTEN.")
		fs.PrintDefaults()
	}
	if len(args) == 0 {
		fs.Usage()
		return errors.New("dispatcher functions " + op + ": want a function name")
	}
	name := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if (op == "release") != (*team == "") {
		fs.Usage()
		return errors.New("dispatcher functions " + op + ": -team is for reserve and transfer only, and they need it")
	}
	js, closeNC, err := connectTo(natsURLForTools(), "toolrelay-functions")
	if err != nil {
		return err
	}
	defer closeNC()
	switch op {
	case "reserve":
		err = dispatch.ReserveName(ctx, js, name, *team)
	case "transfer":
		err = dispatch.TransferName(ctx, js, name, *team)
	default:
		err = dispatch.ReleaseName(ctx, js, name)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %sd\n", name, op)
	return nil
}
