{{ set +e; timeout {overall} curl -fsSL --proto {proto} --proto-redir {proto_redir} --max-redirs 5 --connect-timeout 30 --speed-limit 1024 --speed-time {stall} "$url"; echo "$?" > "$part.status"; }} | head -c {limit} > "$part"
status="$(cat "$part.status")"
rm -f "$part.status"
if [ "$status" != 0 ] && [ "$(wc -c < "$part")" -le "$max" ]; then
  echo "localmodel: cannot download $url (curl exit status $status; 124: took longer than {overall} s)" >&2
  rm -f "$part"
  exit 1
fi
