#!/usr/bin/env bash
# The README's "Try it": every pattern by hand, with curl, against a started service (`npm start`).
#
#   scripts/try-it.sh
#
# BASE_URL (http://localhost:3000), API_KEY (the dev key), PSP_API_KEY (the in-process sandbox's dev provider key)
# and WEBHOOK_SECRET (the embedded run's dev secret) point it elsewhere. Each request is printed with its status and the headers that matter; the status each
# comment promises is checked, and the first one that differs stops the script (exit 1). Needs bash, curl, node.
set -euo pipefail
cd "$(dirname "$0")/.."   # node finds the project's packages (standardwebhooks) from here

BASE_URL=${BASE_URL:-http://localhost:3000}
API_KEY=${API_KEY:-dev-secret-change-me}
PSP_API_KEY=${PSP_API_KEY:-sk_test_dev-only-psp-key-change-me}
WEBHOOK_SECRET=${WEBHOOK_SECRET:-whsec_ZGV2LW9ubHktd2ViaG9vay1zZWNyZXQtY2hhbmdlISE=}
AUTH="Authorization: Bearer $API_KEY"
JSON='Content-Type: application/json'
RUN=$(date +%s%N)   # order numbers and keys of this run: the service keeps its data between runs
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# call STATUS METHOD PATH [curl options…]: sends it, prints the status, the headers that matter and the body;
# stops unless the status is STATUS. The answer stays in $TMP/body and $TMP/headers for the helpers below.
# A client's API key, except under /psp: the sandbox provider takes its own secret key, as a provider does.
call() {
  local want=$1 method=$2 path=$3
  shift 3
  echo "→ $method $path"
  local got auth=$AUTH
  case $path in /psp/*) auth="Authorization: Bearer $PSP_API_KEY" ;; esac
  got=$(curl -sS -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' -X "$method" "$BASE_URL$path" -H "$auth" "$@")
  echo "← $got"
  grep -iE '^(location|etag|idempotent-replayed|retry-after):' "$TMP/headers" | tr -d '\r' | sed 's/^/  /' || true
  echo "  $(head -c 400 "$TMP/body")"
  if [ "$got" != "$want" ]; then
    echo "✗ expected $want, got $got" >&2
    exit 1
  fi
}
# field NAME: a member of the last JSON answer (a.b for nested ones), printed as is.
field() { node -e 'const v = process.argv[1].split(".").reduce((o, k) => o?.[k], JSON.parse(require("fs").readFileSync(0, "utf8"))); console.log(v ?? "")' "$1" < "$TMP/body"; }
# header NAME: a header of the last answer.
header() { grep -i "^$1:" "$TMP/headers" | head -1 | cut -d' ' -f2- | tr -d '\r'; }
say() { printf '\n# %s\n' "$*"; }
check() { if ! [ "$1" = "$2" ]; then echo "✗ $3: expected $2, got $1" >&2; exit 1; fi; }

BODY='{"orderNumber":"PO-'$RUN'","currency":"EUR","items":[{"sku":"SKU-1","quantity":2,"unitPriceMinor":1999}]}'

say "create an order under an Idempotency-Key: 201 + Location"
call 201 POST /orders -H "Idempotency-Key: order-$RUN" -H "$JSON" -d "$BODY"
ID=$(field id)

say "retry with the same key: the same bytes again, with Idempotent-Replayed: true"
call 201 POST /orders -H "Idempotency-Key: order-$RUN" -H "$JSON" -d "$BODY"
check "$(header idempotent-replayed)" true "Idempotent-Replayed"

say "same key, another body: 422 idempotency-key-reused, nothing runs"
call 422 POST /orders -H "Idempotency-Key: order-$RUN" -H "$JSON" -d "${BODY/\"quantity\":2/\"quantity\":3}"

say "a new key with the same orderNumber and content: 200 and the same order (the natural key)"
call 200 POST /orders -H "Idempotency-Key: order-again-$RUN" -H "$JSON" -d "$BODY"
check "$(field id)" "$ID" "the order"

say "read it: ETag is its version, for If-Match"
call 200 GET "/orders/$ID"
ETAG=$(header etag)

say "edit with If-Match: 200, a new ETag; the same (now stale) ETag again: 412"
call 200 PATCH "/orders/$ID" -H "If-Match: $ETAG" -H "$JSON" -d '{"note":"leave at the door"}'
call 412 PATCH "/orders/$ID" -H "If-Match: $ETAG" -H "$JSON" -d '{"note":"ring twice"}'

say "pay it: 201 + Location; the same key again replays, and charges nothing"
call 201 POST "/orders/$ID/payments" -H "Idempotency-Key: pay-$RUN" -H "$JSON" -d '{"source":"tok_visa"}'
PAYMENT_ID=$(field id)
PAYMENT=$(cat "$TMP/body")
call 201 POST "/orders/$ID/payments" -H "Idempotency-Key: pay-$RUN" -H "$JSON" -d '{"source":"tok_visa"}'
check "$(header idempotent-replayed)" true "Idempotent-Replayed"

say "the provider's ledger (the in-process sandbox under /psp, with its provider key): one charge for that payment"
call 200 GET "/psp/charges?paymentId=$PAYMENT_ID"
check "$(field items.length)" 1 "charges of the payment"

say "a lost answer: tok_lost charges, but no answer comes in time. This takes ~11 s (5 attempts × PSP_TIMEOUT_MS, then 503)"
call 201 POST /orders -H "Idempotency-Key: other-$RUN" -H "$JSON" \
  -d '{"orderNumber":"PO-'$RUN'-2","currency":"EUR","items":[{"sku":"SKU-2","quantity":1,"unitPriceMinor":500}]}'
OTHER_ID=$(field id)
call 503 POST "/orders/$OTHER_ID/payments" -H "Idempotency-Key: lost-$RUN" -H "$JSON" -d '{"source":"tok_lost"}'
LOST_ID=$(field paymentId)
sleep "$(header retry-after)"
say "retried with the same key after Retry-After: 201 with the same payment (looked up, or settled by the webhook meanwhile)"
call 201 POST "/orders/$OTHER_ID/payments" -H "Idempotency-Key: lost-$RUN" -H "$JSON" -d '{"source":"tok_lost"}'
check "$(field id)" "$LOST_ID" "the payment"
call 200 GET "/psp/charges?paymentId=$LOST_ID"
check "$(field items.length)" 1 "charges of the lost payment"
call 200 GET "/orders/$OTHER_ID/payments"

say "cancel the paid order, twice: 200 both times, and one cancelled row in its history"
call 200 POST "/orders/$ID/cancel"
call 200 POST "/orders/$ID/cancel"
call 200 GET "/orders/$ID/events"

say "refund 500, then the rest: each 201; the order becomes refunded"
call 201 POST "/payments/$PAYMENT_ID/refunds" -H "Idempotency-Key: refund-$RUN" -H "$JSON" -d '{"amountMinor":500}'
call 201 POST "/payments/$PAYMENT_ID/refunds" -H "Idempotency-Key: refund-rest-$RUN" -H "$JSON" -d '{}'
call 200 GET "/orders/$ID"
check "$(field status)" refunded "the order's status"

say "a form submit: one token, one order, however often the button is pressed (the second: 409 naming the order)"
call 201 POST /submit-tokens
TOKEN=$(field token)
FORM='{"currency":"EUR","items":[{"sku":"SKU-1","quantity":1,"unitPriceMinor":500}]}'
call 201 POST /orders -H "Submit-Token: $TOKEN" -H "$JSON" -d "$FORM"
call 409 POST /orders -H "Submit-Token: $TOKEN" -H "$JSON" -d "$FORM"

say "keyset pagination: two at a time, then the page after nextCursor"
call 200 GET '/orders?limit=2'
CURSOR=$(field nextCursor)
call 200 GET "/orders?limit=2&cursor=$CURSOR"

say "a webhook signed as the provider signs it (Standard Webhooks) for the first charge: applied, or no effect when already settled; sent again, a duplicate"
EVENT=$(node -e '
  const p = JSON.parse(process.argv[1]);
  const data = { chargeId: p.providerTransactionId, paymentId: p.id, orderId: p.orderId, amountMinor: p.amountMinor, currency: p.currency, status: "succeeded" };
  console.log(JSON.stringify({ type: "charge.succeeded", timestamp: new Date().toISOString(), data }));' "$PAYMENT")
WEBHOOK_ID=msg_$RUN
TS=$(date +%s)
SIGNATURE=$(node -e 'const { Webhook } = require("standardwebhooks"); console.log(new Webhook(process.argv[1]).sign(process.argv[2], new Date(process.argv[3] * 1000), process.argv[4]))' \
  "$WEBHOOK_SECRET" "$WEBHOOK_ID" "$TS" "$EVENT")
call 200 POST /webhooks/psp -H "$JSON" -H "webhook-id: $WEBHOOK_ID" -H "webhook-timestamp: $TS" -H "webhook-signature: $SIGNATURE" --data "$EVENT"
call 200 POST /webhooks/psp -H "$JSON" -H "webhook-id: $WEBHOOK_ID" -H "webhook-timestamp: $TS" -H "webhook-signature: $SIGNATURE" --data "$EVENT"
check "$(field outcome)" duplicate "the second delivery's outcome"

say "operations: health and a few metrics"
call 200 GET /health
curl -sS "$BASE_URL/metrics" | grep -E '^(idempotency|psp|webhook|payments)_' | head -8 || true

printf '\n✓ every answer was the one its comment promises\n'
