set -eu
file={file}
part={part}
mark={mark}
url={url}
want={sha256}
max={max_bytes}
mkdir -p "$(dirname "$file")" "$(dirname "$part")" "$(dirname "$mark")"
# What the record vouches for: the checksum, and the file as it was when it
# was checked (size, inode, device, modification and change times). Any write
# to the file changes its change time, which no process without the clock
# can set back: a file changed since is hashed again. A writer of the volume
# can write the record too: it vouches as far as they are trusted
# (docs/security.md, What the checksum record trusts).
stamp() {{ stat -c '%s %i %d %.9Y %.9Z' "$1"; }}
if [ -f "$file" ] && [ "$(cat "$mark" 2>/dev/null)" = "$want $(stamp "$file")" ]; then
  echo "localmodel: $file already on the volume (sha256 recorded, file unchanged since): no download"
  exit 0
fi
if [ -f "$file" ]; then
  got="$(sha256sum "$file" | cut -d ' ' -f 1)"
  if [ "$got" = "$want" ]; then
    echo "$want $(stamp "$file")" > "$mark"
    echo "localmodel: $file already on the volume (sha256 checked): no download"
    exit 0
  fi
  rm -f "$mark"
  echo "localmodel: $file on the volume has sha256 $got, not $want: downloading it again"
fi
{scheme}rm -f "$part"
{fetch}
size="$(wc -c < "$part")"
if [ "$size" -gt "$max" ]; then
  echo "localmodel: the download from $url is larger than $max bytes (the memory limit of the model or its volume, whichever is smaller): aborted" >&2
  rm -f "$part"
  exit 1
fi
got="$(sha256sum "$part" | cut -d ' ' -f 1)"
if [ "$got" != "$want" ]; then
  echo "localmodel: the download from $url has sha256 $got, not $want" >&2
  rm -f "$part"
  exit 1
fi
mv -f "$part" "$file"
echo "$want $(stamp "$file")" > "$mark"
echo "localmodel: downloaded $file"
