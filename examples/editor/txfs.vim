" txfs.vim: Vim saves files on a txfs mount as one transaction each.
"
"   let g:txfs_mount = '/mnt/tx'        " required: where the mount is
"   let g:txfs_bin = 'txfs'             " optional: the txfs binary
"   source /path/to/examples/editor/txfs.vim
"
" Faust §4.3 ported Vim's save with two lines of C (begin/commit) and had to
" set backupcopy=yes so Vim writes the file in place. Here no Vim code
" changes: BufWriteCmd hands the buffer to `txfs run -- sh -c 'cat > FILE'`,
" which truncates and rewrites FILE in place inside a transaction. The
" result: the file keeps its inode, owner, mode, hard links and xattrs (like
" backupcopy=yes), no backup or temp file is written, and a crash or kill
" mid-save leaves the old contents whole (unlike a plain backupcopy=yes
" save, which can leave the file truncated). If the save fails the buffer
" stays modified and the file is unchanged.

if !exists('g:txfs_mount')
  echoerr 'txfs.vim: set g:txfs_mount first'
  finish
endif

function! s:TxfsWrite() abort
  let l:file = expand('<afile>:p')
  let l:cmd = get(g:, 'txfs_bin', 'txfs') . ' run --mount ' . shellescape(g:txfs_mount, 1)
        \ . ' -- sh -c ' . shellescape('cat > "$0"', 1) . ' ' . shellescape(l:file, 1)
  " '[,'] is the range being written (the whole buffer for :w).
  silent execute "'[,']write !" . l:cmd
  if v:shell_error
    echoerr 'txfs save of ' . l:file . ' failed (exit ' . v:shell_error . '); the file is unchanged'
  elseif line("'[") == 1 && line("']") == line('$')
    setlocal nomodified
  endif
endfunction

augroup txfs_save
  autocmd!
  execute 'autocmd BufWriteCmd ' . fnameescape(g:txfs_mount) . '/* call s:TxfsWrite()'
augroup END
