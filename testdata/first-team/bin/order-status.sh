#!/bin/sh
# The arguments arrive as JSON on stdin; stdout is the output.
case "$(cat)" in
  *A-1002*) echo '{"status":"packing","carrier":"dhl"}' ;;
  *) echo '{"status":"shipped","carrier":"ups"}' ;;
esac
