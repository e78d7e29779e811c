echo 'localmodel: creating '{model}' from '{file}' on the volume: no registry pull'
