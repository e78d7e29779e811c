set -eu
file={file}
part={part}
mark={mark}
url={url}
want={sha256}
mkdir -p "$(dirname "$file")" "$(dirname "$part")" "$(dirname "$mark")"
if [ -f "$file" ] && [ "$(cat "$mark" 2>/dev/null)" = "$want" ]; then
  echo "localmodel: $file already on the volume (sha256 recorded): no download"
  exit 0
fi
if [ -f "$file" ]; then
  got="$(sha256sum "$file" | cut -d ' ' -f 1)"
  if [ "$got" = "$want" ]; then
    echo "$want" > "$mark"
    echo "localmodel: $file already on the volume (sha256 checked): no download"
    exit 0
  fi
  echo "localmodel: $file on the volume has sha256 $got, not $want: downloading it again"
fi
rm -f "$part"
{fetch}
got="$(sha256sum "$part" | cut -d ' ' -f 1)"
if [ "$got" != "$want" ]; then
  echo "localmodel: the download from $url has sha256 $got, not $want" >&2
  rm -f "$part"
  exit 1
fi
mv -f "$part" "$file"
echo "$want" > "$mark"
echo "localmodel: downloaded $file"
